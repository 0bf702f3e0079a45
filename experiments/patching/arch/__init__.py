"""One adapter per architecture, keyed on transformers' `config.model_type`."""

from __future__ import annotations

from experiments.core.errors import UserError
from experiments.patching.arch import gemma3, gpt2, gptj, llama, mixtral
from experiments.patching.arch.base import BlockAdapter

ADAPTERS: dict[str, BlockAdapter] = {
    t: module.ADAPTER for module in (gemma3, llama, gpt2, mixtral, gptj) for t in module.ADAPTER.model_types
}
VARIANTS = ("naive", "stable", "conditioned", "closed_loop", "closed_loop_scale")
CLOSED_LOOP = ("closed_loop", "closed_loop_scale")  # patched inside each layer's forward (closed_loop.py)


def supported() -> str:
    return ", ".join(sorted(ADAPTERS))


def adapter_for(model_type: str) -> BlockAdapter:
    """The adapter for a transformers `model_type`, or one line naming the supported ones."""
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise UserError(f"model_type {model_type!r} has no context-patching adapter; "
                        f"supported: {supported()}") from None


def check_variant(adapter: BlockAdapter, variant: str) -> None:
    if variant not in VARIANTS:
        raise UserError(f"variant={variant!r} is not one of {', '.join(VARIANTS)}")
    if variant in ("stable", "conditioned") and not adapter.stable:
        have = ", ".join(sorted({a.family for a in ADAPTERS.values() if a.stable}))
        raise UserError(f"variant={variant} (App. B) needs a post-MLP norm, which {adapter.family} does not have "
                        f"(only {have}); use variant=naive or closed_loop")
    if variant == "closed_loop_scale" and not adapter.pre_norm_matrix:
        raise UserError(f"variant=closed_loop_scale (Thm 10 alone in the closed loop) is the Gemma 3 closed loop "
                        f"without its W_down step; {adapter.family} has no post-MLP norm: use variant=closed_loop")
