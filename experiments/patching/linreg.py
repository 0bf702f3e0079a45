"""The rank-1 patch applied to a trained contextual block, and the patched model's forward.

The patched model is the same module run through `torch.func.functional_call` with W (and b′)
replaced by W + ΔW (and b′ + δA): a genuine forward pass of changed weights in the model's
dtype, vectorized over tasks with `vmap` because every task has its own patch.
"""

from __future__ import annotations

import warnings

from torch import Tensor, nn
from torch.func import functional_call, vmap

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
    W = model.mlp.w1.weight
    if getattr(model, "mlp_skip", False):
        dW, db = context_patch_skip(W, a_full, a_reduced)
        return {W_NAME: W + dW, B2_NAME: model.mlp.w2.bias + db}
    return {W_NAME: W + context_patch(W, a_full, a_reduced)}


def forward_with(model: nn.Module, params: dict[str, Tensor], tokens: Tensor) -> Tensor:
    """Run `model` on each prompt tokens[b] with its parameters replaced by params[name][b]."""

    def one(p: dict[str, Tensor], t: Tensor) -> Tensor:
        return functional_call(model, p, (t.unsqueeze(0),)).squeeze(0)

    with warnings.catch_warnings():
        # The fused CPU attention kernel has no vmap rule yet, so torch loops over tasks for that
        # one op (correct, and cheap for the short no-context prompts); its warning is noise here.
        warnings.filterwarnings("ignore", message=".*batching rule.*scaled_dot_product")
        return vmap(one)(params, tokens)


def predictions_three_ways(model: nn.Module, tokens: Tensor) -> dict[str, Tensor]:
    """ŷ for each prompt: with its context, via the patch without context, and the control
    (unpatched, without context). All genuine forward passes."""
    from experiments.models.linreg import predict

    query = tokens[:, -1:]
    return {
        "context": predict(model(tokens)),
        "patched": predict(forward_with(model, patched_params(model, tokens), query)),
        "no_context": predict(model(query)),
    }
