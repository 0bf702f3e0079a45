"""Theorem B.2 applied block by block to a stack of post-LN blocks (Dherin et al. App. C, Eqs. 17–22).

To remove a part Y of the context from a stack Φ = Φ⁽ᴸ⁾ ∘ … ∘ Φ⁽¹⁾, patch every block's first MLP
matrix W₁⁽ⁱ⁾ by the rank-1 ΔW⁽ⁱ⁾ and its last bias b₂⁽ⁱ⁾ by δA⁽ⁱ⁾, from the first block to the last:
block i's reduced input is the output of the *already patched* blocks 1..i−1 on the reduced prompt
(C∖Y, x), so that (Eq. 21)

    x⁽ⁱ⁾ = Φ⁽ⁱ⁾_{W,b}(C, x⁽ⁱ⁻¹⁾) = Φ⁽ⁱ⁾_{W+ΔW, b+Δb}(C∖Y, Φ⁽ⁱ⁻¹⁾_{patched}(…)).

The patched model is one set of weights run on the reduced prompt (Eq. 22): with a partial removal
(Y = the first k examples) the remaining context tokens pass through the same patched blocks, and
only the query's output is claimed equal to the full model's (δA⁽ⁱ⁾ is taken at the query, from
exactly that reduced pass, so the theorem holds there whatever those tokens' activations are).

Patches have a leading task dimension B (each prompt has its own), so the patched stack runs
through `forward_with` (functional_call under vmap): a genuine forward pass of changed weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.dherin.models.linreg import predict
from experiments.dherin.models.post_ln_stack import PostLNStack
from experiments.dherin.patched_forward import B2_NAME, W_NAME, forward_with
from experiments.patching.rank1 import context_patch_skip


def reduced_prompt(tokens: Tensor, n_removed: int | None = None) -> Tensor:
    """(C∖Y, x) with Y = the first `n_removed` examples (one token each); the query alone if None."""
    return tokens[:, -1:] if n_removed is None else tokens[:, n_removed:]


def block_params(block: nn.Module, dW: Tensor, db: Tensor) -> dict[str, Tensor]:
    """W₁ + ΔW and b₂ + Δb for one block, per task."""
    return {W_NAME: block.mlp.w1.weight + dW, B2_NAME: block.mlp.w2.bias + db}


@torch.no_grad()
def stack_patches(model: PostLNStack, tokens: Tensor, n_removed: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """[(ΔW₁⁽ⁱ⁾, Δb₂⁽ⁱ⁾) for i = 1..L], computed first block to last; (B, d_mlp, d_model) and (B, d_model)."""
    h_full = model.read_in(tokens)
    h_reduced = model.read_in(reduced_prompt(tokens, n_removed))
    patches = []
    for block in model.blocks:
        a_full = block.contextual(h_full)[:, -1]
        a_reduced = block.contextual(h_reduced)[:, -1]
        dW, db = context_patch_skip(block.mlp.w1.weight, a_full, a_reduced)
        patches.append((dW, db))
        h_full = block(h_full)
        # the patched block i, run on its reduced input, is what block i+1 sees without Y
        h_reduced = forward_with(block, block_params(block, dW, db), h_reduced)
    return patches


def patched_stack_params(model: PostLNStack, patches: list[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """Every block's W₁ + ΔW and b₂ + Δb under the stack's parameter names, per task."""
    params = {}
    for i, (block, (dW, db)) in enumerate(zip(model.blocks, patches, strict=True)):
        params.update({f"blocks.{i}.{k}": v for k, v in block_params(block, dW, db).items()})
    return params


class _AllBlocks(nn.Module):
    """The stack with every block's output as its output, so `forward_with` can run it."""

    def __init__(self, stack: PostLNStack):
        super().__init__()
        self.stack = stack

    def forward(self, tokens: Tensor) -> Tensor:
        return self.stack(tokens, return_blocks=True)


@torch.no_grad()
def patched_block_outputs(model: PostLNStack, params: dict[str, Tensor], tokens: Tensor) -> Tensor:
    """Every block's output (B, L, T, d_model) of the stack run with per-task `params` on `tokens`."""
    return forward_with(_AllBlocks(model), {f"stack.{k}": v for k, v in params.items()}, tokens)


@torch.no_grad()
def query_block_outputs_three_ways(model: PostLNStack, tokens: Tensor,
                                   n_removed: int | None = None) -> dict[str, Tensor]:
    """Each block's output at the query, (B, L, d_model): with the full context, via the patches
    without Y, and the control (unpatched, without Y). All genuine forward passes."""
    reduced = reduced_prompt(tokens, n_removed)
    params = patched_stack_params(model, stack_patches(model, tokens, n_removed))
    return {
        "context": model(tokens, return_blocks=True)[:, :, -1],
        "patched": patched_block_outputs(model, params, reduced)[:, :, -1],
        "no_context": model(reduced, return_blocks=True)[:, :, -1],
    }


@torch.no_grad()
def stack_predictions_three_ways(model: PostLNStack, tokens: Tensor, n_removed: int | None = None) -> dict[str, Tensor]:
    """ŷ with the full context, via the patched stack without Y, and the control (unpatched, without Y)."""
    reduced = reduced_prompt(tokens, n_removed)
    params = patched_stack_params(model, stack_patches(model, tokens, n_removed))
    return {
        "context": predict(model(tokens)),
        "patched": predict(forward_with(model, params, reduced)),
        "no_context": predict(model(reduced)),
    }
