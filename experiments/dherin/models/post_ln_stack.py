"""The deep post-LN transformer of Dherin et al. App. C.1 (Vaswani et al. 2017's block):

    Φ⁽ⁱ⁾(x) = LayerNorm(y + MLP⁽ⁱ⁾(y)),  y = LayerNorm(x + MultiHeadAttn⁽ⁱ⁾(x)),
    MLP⁽ⁱ⁾(y) = W₂⁽ⁱ⁾ ReLU(W₁⁽ⁱ⁾ y + b₁⁽ⁱ⁾) + b₂⁽ⁱ⁾,         Φ = Φ⁽ᴸ⁾ ∘ … ∘ Φ⁽¹⁾.

Each block is a `ContextualBlock` of the single-layer model with the contextual layer
A⁽ⁱ⁾ = LayerNorm(x + MHA⁽ⁱ⁾(x)) and an MLP skip, followed by a context-free LayerNorm. So Theorem
B.2 applies to the part inside the final LayerNorm: A + φ(A) is reproduced exactly by patching
W₁⁽ⁱ⁾ (`mlp.w1.weight`) by the rank-1 ΔW and b₂⁽ⁱ⁾ (`mlp.w2.bias`) by δA, and the LayerNorm after it,
which sees no context, then gives the same block output.

How tokens enter. The single-layer model runs on the raw (d+1)-wide tokens; a post-LN stack cannot:
a LayerNorm over the 3 components of (x, y) would remove their mean and scale, i.e. most of what
the token says. So a linear read-in lifts tokens to d_model (the paper's d_model = 32 with
d_k = d_model/h), the blocks run at that width, and a linear read-out maps the last block's output
(unit-scale after its LayerNorm) to a prediction of any size. Both act token by token and never see
the context, so they take no part in the patch. The output has width 1, so `predict` (last
component of the query token's output) reads the prediction as for the single-layer model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.dherin.models.linreg import MLP, AttentionContextual, ContextualBlock


class PostLNBlock(ContextualBlock):
    """Φ(x) = LayerNorm(A + φ(A)) with A = LayerNorm(x + MHA(x)); `contextual` is A, `mlp` is φ."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int):
        contextual = nn.Sequential(AttentionContextual(d_model, d_model, n_heads, skip=True), nn.LayerNorm(d_model))
        super().__init__(contextual, MLP(d_model, d_mlp, d_model), mlp_skip=True)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(super().forward(x))


class PostLNStack(nn.Module):
    """read-in → L post-LN blocks → read-out. Block i's parameters are `blocks.{i}.…`."""

    def __init__(self, d: int, n_layers: int = 10, d_model: int = 32, n_heads: int = 8, d_mlp: int = 128):
        super().__init__()
        self.read_in = nn.Linear(d + 1, d_model)
        self.blocks = nn.ModuleList(PostLNBlock(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.read_out = nn.Linear(d_model, 1)

    def forward(self, tokens: Tensor, return_blocks: bool = False) -> Tensor:
        """(B, T, 1) outputs; with `return_blocks`, every block's output instead, (B, L, T, d_model)."""
        h = self.read_in(tokens)
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        if return_blocks:
            return torch.stack(outs, dim=1)
        return self.read_out(h)

