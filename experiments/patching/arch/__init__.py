"""One adapter per architecture, keyed on transformers' `config.model_type`.

Adding an architecture: its adapter file here (a `BlockAdapter` naming its Table 1 rule and carrying its
tiny test config; for a block Llama's adapter already describes, `dataclasses.replace` of it, as qwen3.py)
and its line in FAMILIES. The offline tiny model, the parametrized tests over TINY_MODELS and
`model_type` lookup follow from that line. Every adapter is checked against the stock decoder layer when a
model is loaded (check.py): a block it misdescribes is refused in one line saying what differed.

A `model_type` with no adapter whose decoder layer has Llama's module names (llama_style.py) is tried
with the Llama adapter (LLAMA_STYLE) and kept only if that check passes (docs/models.md says why)."""

from __future__ import annotations

from experiments.core.errors import UserError
from experiments.patching.arch import gemma3, gpt2, gpt_neox, gptj, llama, mixtral, olmo2, phi3, qwen3
from experiments.patching.arch.base import BlockAdapter

FAMILIES: tuple[BlockAdapter, ...] = (
    gemma3.ADAPTER,
    llama.ADAPTER,
    gpt2.ADAPTER,
    mixtral.ADAPTER,
    gptj.ADAPTER,
    olmo2.ADAPTER,
    qwen3.ADAPTER,
    phi3.ADAPTER,
    gpt_neox.ADAPTER,
)
ADAPTERS: dict[str, BlockAdapter] = {t: adapter for adapter in FAMILIES for t in adapter.model_types}
# model_type -> the Llama adapter tried for a family without one whose layer has Llama's module names
# (llama_style.py); on trial until the model's check passes (check.py removes a failed one)
LLAMA_STYLE: dict[str, BlockAdapter] = {}
# offline name -> adapter, for the families that carry a tiny random test model (all of them today)
TINY_MODELS: dict[str, BlockAdapter] = {a.tiny_model: a for a in FAMILIES if a.tiny_model and a.tiny_config}
VARIANTS = ("naive", "stable", "conditioned", "closed_loop", "closed_loop_scale")
CLOSED_LOOP = ("closed_loop", "closed_loop_scale")  # patched inside each layer's forward (closed_loop.py)


def supported() -> str:
    return ", ".join(sorted(ADAPTERS))


def adapter_for(model_type: str) -> BlockAdapter:
    """The adapter for a transformers `model_type`, or one line naming the supported ones."""
    try:
        return ADAPTERS[model_type] if model_type in ADAPTERS else LLAMA_STYLE[model_type]
    except KeyError:
        raise UserError(f"model_type {model_type!r} has no context-patching adapter; "
                        f"supported: {supported()}") from None


def check_variant(adapter: BlockAdapter, variant: str) -> None:
    if variant not in VARIANTS:
        raise UserError(f"variant={variant!r} is not one of {', '.join(VARIANTS)}")
    if variant in ("stable", "conditioned") and not adapter.stable:
        have = ", ".join(sorted({a.family for a in ADAPTERS.values() if a.stable}))
        if adapter.pre_norm_matrix:  # a post-MLP norm, but not the block App. B's code is written for
            raise UserError(f"variant={variant} (App. B) is written for Gemma 3's block (scale 1 + weight); "
                            f"{adapter.family} has a post-MLP norm but no App. B update here (only {have}); "
                            "use variant=naive or closed_loop")
        raise UserError(f"variant={variant} (App. B) needs a post-MLP norm, which {adapter.family} does not have "
                        f"(only {have}); use variant=naive or closed_loop")
    if variant == "closed_loop_scale" and not adapter.pre_norm_matrix:
        raise UserError(f"variant=closed_loop_scale (Thm 10 alone in the closed loop) is the post-norm closed loop "
                        f"without its W_down step; {adapter.family} has no post-MLP norm: use variant=closed_loop")
