"""The rank-1 patch applied to a trained contextual block, and the patched model's forward.

The patched model is the same module run through `torch.func.functional_call` with W (and b′)
replaced by W + ΔW (and b′ + δA): a genuine forward pass of changed weights in the model's
dtype, vectorized over tasks with `vmap` because every task has its own patch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from experiments.patching.rank1 import context_patch, context_patch_skip

W_NAME = "mlp.w1.weight"
B2_NAME = "mlp.w2.bias"


def contextual_outputs(model: nn.Module, tokens: Tensor, n_removed: int | None = None) -> tuple[Tensor, Tensor]:
    """(A(C, x), A(C∖Y, x)) at the last token, Y = the first `n_removed` tokens (all but x if None)."""
    a_full = model.contextual(tokens)[:, -1]
    reduced = tokens[:, -1:] if n_removed is None else tokens[:, n_removed:]
    a_reduced = model.contextual(reduced)[:, -1]
    return a_full, a_reduced


def patched_params(model: nn.Module, tokens: Tensor, n_removed: int | None = None) -> dict[str, Tensor]:
    """Per-task weights that absorb the removed context: {W: W + ΔW} (+ {b′: b′ + δA} with skip).

    Each value has a leading task dimension B.
    """
    a_full, a_reduced = contextual_outputs(model, tokens, n_removed)
    return patch_from(model, a_full, a_reduced)


def patch_from(model: nn.Module, a_full: Tensor, a_reduced: Tensor) -> dict[str, Tensor]:
    """The patched parameters given A(C, x) and A(C∖Y, x) (each (B, d_in))."""
    W = model.mlp.w1.weight
    if getattr(model, "mlp_skip", False):
        dW, db = context_patch_skip(W, a_full, a_reduced)
        return {W_NAME: W + dW, B2_NAME: model.mlp.w2.bias + db}
    return {W_NAME: W + context_patch(W, a_full, a_reduced)}


def forward_with(model: nn.Module, params: dict[str, Tensor], tokens: Tensor) -> Tensor:
    """Run `model` on each prompt tokens[b] with its parameters replaced by params[name][b]."""

    def one(p: dict[str, Tensor], t: Tensor) -> Tensor:
        return functional_call(model, p, (t.unsqueeze(0),)).squeeze(0)

    if not supports_vmap(model):  # e.g. torch.nn.RNN's fused kernel: the same forward, task by task
        return torch.stack([one({k: v[b] for k, v in params.items()}, tokens[b]) for b in range(len(tokens))])
    # The fused CPU attention kernel has no vmap rule, so torch would loop over tasks one by one;
    # the math backend of the same op batches (identical numbers here, ~8x faster).
    with sdpa_kernel(SDPBackend.MATH):
        return vmap(one)(params, tokens)


def supports_vmap(model: nn.Module) -> bool:
    """False when a submodule says `supports_vmap = False` (its kernel has no batching rule)."""
    return all(getattr(m, "supports_vmap", True) for m in model.modules())


def predictions_three_ways(model: nn.Module, tokens: Tensor, cache=None) -> dict[str, Tensor]:
    """ŷ for each prompt: with its context, via the patch without context, and the control
    (unpatched, without context). All genuine forward passes of the model.

    With `cache` (keys/values of one context shared by every prompt, see AttentionContextual.cache)
    `tokens` holds only the query tokens (B, 1, d_in): many queries against one context, cheaply.
    """
    from experiments.dherin.models.linreg import predict

    query = tokens[:, -1:]
    a_full = model.contextual(tokens) if cache is None else model.contextual(query, cache)
    a_query = model.contextual(query)
    params = patch_from(model, a_full[:, -1], a_query[:, -1])
    return {
        "context": predict(model.head(a_full)),
        "patched": predict(forward_with(model, params, query)),
        "no_context": predict(model.head(a_query)),
    }
