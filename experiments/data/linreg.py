"""In-context linear regression prompts (Dherin et al. §4.1).

A task is h(x) = ωᵀx with ω ~ N(0, I_d). A prompt is the (N+1) × (d+1) token matrix
(x_1, h(x_1)), ..., (x_N, h(x_N)), (x_query, 0): the query's label slot is zero and its label is
the target. Tokens are rows here (the paper writes them as columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LinRegBatch:
    tokens: Tensor  # (B, N+1, d+1): N examples then the query with label slot 0
    targets: Tensor  # (B,): ω·x_query
    weights: Tensor  # (B, d): ω

    @property
    def context(self) -> Tensor:
        return self.tokens[:, :-1]

    @property
    def query(self) -> Tensor:
        """The query token alone, as a length-1 sequence (B, 1, d+1)."""
        return self.tokens[:, -1:]

    def to(self, device=None, dtype=None) -> LinRegBatch:
        return LinRegBatch(self.tokens.to(device, dtype), self.targets.to(device, dtype),
                           self.weights.to(device, dtype))


def make_prompts(weights: Tensor, xs: Tensor, x_query: Tensor) -> LinRegBatch:
    """Prompts from given ω (B, d), examples xs (B, N, d) and queries (B, d)."""
    labels = torch.einsum("bnd,bd->bn", xs, weights)
    examples = torch.cat([xs, labels.unsqueeze(-1)], dim=-1)
    query = torch.cat([x_query, torch.zeros_like(x_query[:, :1])], dim=-1).unsqueeze(1)
    return LinRegBatch(torch.cat([examples, query], dim=1), (x_query * weights).sum(-1), weights)


def sample_prompts(batch: int, n_examples: int, d: int, generator: torch.Generator,
                   dtype: torch.dtype = torch.float32) -> LinRegBatch:
    """Fresh tasks: ω, x_i, x_query all standard normal (sampled in float32 on CPU, then cast,
    so the same seed gives the same tasks whatever the run's dtype)."""
    w = torch.randn(batch, d, generator=generator)
    xs = torch.randn(batch, n_examples, d, generator=generator)
    xq = torch.randn(batch, d, generator=generator)
    return make_prompts(w, xs, xq).to(dtype=dtype)
