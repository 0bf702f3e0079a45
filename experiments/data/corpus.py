"""One entry point for the GPT experiments' data: `prepare(source, tokenizer, ...)` returns the folder of
train.bin / val.bin for a source (shakespeare, fixture, text_file, openwebtext) and a tokenizer (gpt2, bytes),
preparing it on first use. Run it on one process only (rank 0); the others wait and then read it."""

from __future__ import annotations

from pathlib import Path

from experiments.core.errors import UserError
from experiments.data.gpt2_bpe import encode_documents, get_tokenizer
from experiments.data.token_bins import is_prepared, split_documents, text_key, write_bins

SOURCES = ("shakespeare", "fixture", "text_file", "openwebtext")
FIXTURE = Path(__file__).parent / "fixtures" / "shakespeare_excerpt"  # committed: smoke runs and tests


def read_text_file(path: str) -> dict[str, str]:
    """A .txt file, or a folder of .txt files (one document each)."""
    if not path:
        raise UserError("data=text_file needs text_file=PATH (a .txt file or a folder of them)")
    p = Path(path).expanduser()
    files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
    if not p.exists() or not files:
        raise UserError(f"text_file={path} is not a .txt file nor a folder holding .txt files")
    return {f.name: f.read_text(encoding="utf-8", errors="replace") for f in files}


def prepared_folder(source: str, tokenizer: str, cache: Path, text_file: str | None = None) -> Path:
    if source in ("text_file", "fixture"):
        source = f"text-{text_key(read_text_file(str(FIXTURE) if source == 'fixture' else text_file))}"
    return cache / "tokens" / f"{source}-{tokenizer}"


def prepare(source: str, tokenizer: str, cache: Path, text_file: str | None = None,
            val_fraction: float = 0.05) -> Path:
    if source not in SOURCES:
        raise UserError(f"data={source!r} is not one of {', '.join(SOURCES)}")
    folder = prepared_folder(source, tokenizer, cache, text_file)
    if is_prepared(folder):
        return folder
    tok = get_tokenizer(tokenizer, cache)
    if source == "openwebtext":
        from experiments.data.openwebtext import prepare_openwebtext

        return prepare_openwebtext(folder, tok)
    if source == "shakespeare":
        from experiments.data.shakespeare import shakespeare_documents

        docs = shakespeare_documents(cache)
    else:
        docs = read_text_file(str(FIXTURE) if source == "fixture" else text_file)
    train_docs, val_docs = split_documents(docs, val_fraction)
    meta = {"source": source, "tokenizer": tok.name, "documents": len(docs), "val_fraction": val_fraction}
    return write_bins(folder, encode_documents(train_docs, tok), encode_documents(val_docs, tok), meta)


if __name__ == "__main__":  # prepare once, e.g. on a login node: python -m experiments.data.corpus openwebtext gpt2
    import sys

    from experiments.data.cache import cache_root

    args = sys.argv[1:]
    source = args[0] if len(args) > 0 else "shakespeare"
    tokenizer = args[1] if len(args) > 1 else "gpt2"
    print(prepare(source, tokenizer, cache_root(args[2] if len(args) > 2 else None)))
