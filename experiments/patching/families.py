"""The families with an adapter file, one record each: the one list a new family is added to, and the one place
a family's name, model types, theorem and tiny model are written.

`arch.FAMILIES` (the adapters, in this order), the offline tiny models, the CLI's help, and docs/models.md's
"Adapters today" table all come from FAMILY_TABLE. It is plain data beside kinds.py, not in arch/, so that
what only names the families (`icl-exp patch export --help`, the docs generator) reads it without importing
torch, which every adapter file does through arch/base.py.

An adapter file takes what its record says of it (`said_by(module)`: family, model_types, theorem,
tiny_model) instead of writing it again, so the two cannot drift. `post_norm` alone is a fact the adapter's
own fields decide (its rule and the matrix before the norm: `BlockAdapter.post_norm_block`); the record states
it for the torch-free readers, and arch/__init__.py refuses a record that says otherwise when it collects the
adapters. `block` is the docs table's one-line description of the decoder block.

    python -m experiments.patching.families --markdown   # the docs table
    python -m experiments.patching.families --write      # ... written into docs/models.md between MARKERS
    python -m experiments.patching.families --tiny       # the tiny models, comma-separated (a sweep's model=)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    module: str  # its adapter file: experiments/patching/arch/<module>.py, which defines ADAPTER
    name: str  # the adapter's `family`: a short name for tables and figures
    model_types: tuple[str, ...]  # the adapter's `model_types`: transformers `config.model_type` values it reads
    theorem: str  # the adapter's `theorem`: its Table 1 form
    tiny_model: str  # the adapter's `tiny_model`: the offline tiny random test model
    block: str  # the decoder block in a few words, for the docs table
    post_norm: bool = False  # the block ends in a post-MLP norm: App. B's stable and conditioned variants apply


FAMILY_TABLE: tuple[Family, ...] = (
    Family("gemma3", "Gemma 3", ("gemma3_text", "gemma3"), "Thm 7 + Thm 10 (post-norm scale)", "tiny-gemma3",
           "pre- and post-MLP RMSNorm", post_norm=True),
    Family("llama", "Llama", ("llama", "mistral", "qwen2"), "Thm 7 + Thm 9 (outer weight)", "tiny-llama",
           "pre-norm, SwiGLU"),
    Family("gpt2", "GPT-2", ("gpt2",), "Thm 7 + Thm 8 (outer bias)", "tiny-gpt2",
           "pre-LayerNorm, Conv1D, learned positions"),
    Family("mixtral", "Mixtral", ("mixtral",), "Thm 7 (router too) + Thm 11 (MoE)", "tiny-mixtral",
           "sparse MoE"),
    Family("gptj", "GPT-J", ("gptj",), "Thm 12 (parallel block) + Thm 8 (outer bias)", "tiny-gptj",
           "parallel block, one LayerNorm"),
    Family("olmo2", "OLMo 2", ("olmo2",), "Thm 7 + Thm 10 (post-norm scale, no pre-MLP norm)", "tiny-olmo2",
           "norms after each sublayer", post_norm=True),
    Family("qwen3", "Qwen 3", ("qwen3",), "Thm 7 + Thm 9 (outer weight)", "tiny-qwen3",
           "Llama's (q/k norms inside attention)"),
    Family("phi3", "Phi-3", ("phi3",), "Thm 7 (fused gate/up) + Thm 9 (outer weight)", "tiny-phi3",
           "Llama's with W_gate and W_up fused (`gate_up_proj`)"),
    Family("gpt_neox", "GPT-NeoX", ("gpt_neox",), "Thm 12 (parallel block) + Thm 8 (outer bias)", "tiny-gpt-neox",
           "Pythia's: parallel residual, two LayerNorms (the sequential variant too)"),
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
MARKERS = ("<!-- families:begin (generated: python -m experiments.patching.families --write) -->",
           "<!-- families:end -->")


def record(module: str) -> Family:
    """The record of the adapter file arch/<module>.py."""
    try:
        return next(f for f in FAMILY_TABLE if f.module == module)
    except StopIteration:
        raise KeyError(f"no record for arch/{module}.py in FAMILY_TABLE: add one (docs/design.md, "
                       "'Recipe: add a model family')") from None


def said_by(module: str) -> dict:
    """The adapter fields the record of arch/<module>.py holds, as `BlockAdapter` keywords: what its adapter
    says of itself, written once, here."""
    f = record(module)
    return dict(family=f.name, model_types=f.model_types, theorem=f.theorem, tiny_model=f.tiny_model)


def tiny_models() -> tuple[str, ...]:
    """The offline tiny random models, one per family, in table order."""
    return tuple(f.tiny_model for f in FAMILY_TABLE)


def post_norm_names() -> tuple[str, ...]:
    """The families App. B's post-norm variants apply to."""
    return tuple(f.name for f in FAMILY_TABLE if f.post_norm)


def markdown() -> str:
    """docs/models.md's "Adapters today" table."""
    lines = ["| family | `model_type` | block | Table 1 | tiny test model |", "|---|---|---|---|---|"]
    for f in FAMILY_TABLE:
        types = ", ".join(f"`{t}`" for t in f.model_types)
        lines.append(f"| {f.name} | {types} | {f.block} | {f.theorem} | `{f.tiny_model}` |")
    return "\n".join(lines)


def documented(text: str) -> str:
    """The block between MARKERS in `text` (what the docs say today); '' when the markers are missing."""
    begin, end = MARKERS
    if begin not in text or end not in text:
        return ""
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def with_table(text: str) -> str:
    """`text` with the block between MARKERS replaced by `markdown()`."""
    begin, end = MARKERS
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{markdown()}\n{end}{rest.split(end, 1)[1]}"


if __name__ == "__main__":
    import sys

    what = sys.argv[1:] or ["--markdown"]
    if what == ["--markdown"]:
        print(markdown())
    elif what == ["--tiny"]:
        print(",".join(tiny_models()))
    elif what == ["--write"]:
        DOC.write_text(with_table(DOC.read_text()))
        print(f"wrote the families table into {DOC}")
    else:
        sys.exit("usage: python -m experiments.patching.families [--markdown | --tiny | --write]")
