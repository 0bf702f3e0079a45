"""The open loop per layer and batched across layers (issue 54, `batch_layers`) on one trained model, from the same
with-context step: what the real-model tests compare."""

from __future__ import annotations

from collections.abc import Callable

from experiments.patching.patcher import Patcher
from experiments.zoo.prompts import encode_prompt


def per_layer_and_batched(bundle, prompt: str, batch_layers: str,
                          while_stacked: Callable[[Patcher], object] = lambda patcher: None):
    """(the per-layer patched pass, the batched one) of `prompt`'s query, naive, from one with-context step;
    `while_stacked(patcher)` runs before the batched pass, and the stacks are undone after it (the model as it was,
    each tensor its own storage)."""
    per_layer = Patcher(bundle.model, "naive")
    cache, query = per_layer.start(encode_prompt(bundle, prompt))
    step = per_layer.context_step({"input_ids": query}, cache, logits=False)
    a = per_layer.patched_pass(query, step)
    batched = Patcher(bundle.model, "naive", batch_layers=batch_layers)
    try:
        while_stacked(batched)
        b = batched.patched_pass(query, step)
    finally:
        batched.unstack()
    return a, b
