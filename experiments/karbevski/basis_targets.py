"""App. 8.3's synthetic basis-transfer problem (Karbevski & Mijoski Eqs. 10-11), row-vector form.

Target (Eq. 10): Y = W₂·GELU(W₁x) + Zx − x with W₁ (4h, h), W₂ (h, 4h), Z (h, h) Gaussian, scaled
by 1/√(4h), 1/√(4h) and 1/√h as the paper states. Model (Eq. 11): Y′ = W₂′·GELU(W₁′x) + x, a GELU MLP
of the same shape with a skip connection, no biases. Inputs x ~ N(0, I_h).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BasisTarget:
    w1: torch.Tensor  # (4h, h)
    w2: torch.Tensor  # (h, 4h)
    z: torch.Tensor  # (h, h)

    @classmethod
    def random(cls, h: int, generator: torch.Generator) -> BasisTarget:
        return cls(w1=torch.randn(4 * h, h, generator=generator) / math.sqrt(4 * h),
                   w2=torch.randn(h, 4 * h, generator=generator) / math.sqrt(4 * h),
                   z=torch.randn(h, h, generator=generator) / math.sqrt(h))

    def to(self, device, dtype) -> BasisTarget:
        return BasisTarget(*(t.to(device, dtype) for t in (self.w1, self.w2, self.z)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.w1.T) @ self.w2.T + x @ self.z.T - x


class SkipGeluMLP(nn.Module):
    """Eq. 11: x ↦ W₂′ GELU(W₁′ x) + x (PyTorch's default Linear init; the paper does not give one)."""

    def __init__(self, h: int, mult: int = 4):
        super().__init__()
        self.up = nn.Linear(h, mult * h, bias=False)
        self.down = nn.Linear(mult * h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x))) + x


def relative_sq_error(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The training objective: Σ‖pred − target‖² / Σ‖target‖² over the batch."""
    return (pred - target).pow(2).sum() / target.pow(2).sum()


def mean_cosine_distance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over samples of 1 − cos(pred, target) (Fig. 2 right)."""
    return (1 - F.cosine_similarity(pred, target, dim=-1)).mean()
