"""§5: an L-layer single-head stack and its context-free limit F^(L) (Eq. 6, Thm 5.2).

    h^(0) = x,  y_j^(ℓ) = causal head ℓ on (h_i^(ℓ-1))_{i≤j},  h^(ℓ) = Φ^(ℓ)(h^(ℓ-1), y^(ℓ))

with the residual block Φ(h, y) = h + y (globally Lipschitz, and linear, so a Gaussian stream
stays Gaussian in the limit and Assumption 5.1's elliptical hidden states hold). Eq. 6 then reads

    F^(ℓ)(x) = F^(ℓ-1)(x) + γ Θ_V^(ℓ) Σ_{ℓ-1} Θ_K^(ℓ)ᵀ Θ_Q^(ℓ) F^(ℓ-1)(x),  γ = 1/√d_k (Gaussian),

a deterministic map of the current token that needs only the population covariances Σ_ℓ of h^(ℓ).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from experiments.xu_fang.attention import causal_head, project
from experiments.xu_fang.closed_forms import gamma_gaussian


@dataclass
class Head:
    theta_q: Tensor  # (d_k, d)
    theta_k: Tensor  # (d_k, d)
    theta_v: Tensor  # (d, d)

    def to(self, dtype: torch.dtype, device=None) -> Head:
        return Head(*(t.to(device=device, dtype=dtype) for t in (self.theta_q, self.theta_k, self.theta_v)))


def random_heads(layers: int, d: int, d_k: int, scale: float, generator: torch.Generator) -> list[Head]:
    """Frozen heads with i.i.d. N(0, scale²/d) entries (fan-in init times `scale`). A scale below 1
    keeps the logits' variance qᵀΘ_KΣΘ_Kᵀq/d_k under Thm 5.2's bound d_k as the hidden states grow."""
    def draw(rows: int) -> Tensor:
        return torch.randn(rows, d, generator=generator, dtype=torch.float64) * scale / d**0.5
    return [Head(draw(d_k), draw(d_k), draw(d)) for _ in range(layers)]


def stack_forward(x: Tensor, heads: list[Head]) -> list[Tensor]:
    """[h^(0), ..., h^(L)] for every position of every stream, each (B, T, d)."""
    hidden = [x]
    for head in heads:
        h = hidden[-1]
        hidden.append(h + causal_head(h, head.theta_q, head.theta_k, head.theta_v))
    return hidden


def layer_readout(head: Head, sigma: Tensor) -> Tensor:
    """γ Θ_V Σ Θ_Kᵀ Θ_Q: r^(ℓ) of Eq. 6 as a matrix, for Gaussian hidden states of covariance Σ."""
    return gamma_gaussian(head.theta_q.shape[0]) * head.theta_v @ sigma @ head.theta_k.T @ head.theta_q


def context_free_map(x: Tensor, heads: list[Head], sigmas: list[Tensor]) -> Tensor:
    """F^(L)(x) of Eq. 6, applied token-wise; sigmas = [Σ_0, ..., Σ_{L-1}]."""
    f = x
    for head, sigma in zip(heads, sigmas, strict=True):
        f = f + project(f, layer_readout(head, sigma))
    return f


def population_covariances(sigma: Tensor, heads: list[Head]) -> list[Tensor]:
    """Σ_0 = Σ and Σ_ℓ = M_ℓ Σ_{ℓ-1} M_ℓᵀ with M_ℓ = I + γ Θ_V Σ_{ℓ-1} Θ_Kᵀ Θ_Q: in the equilibrium
    regime h^(ℓ) = F^(ℓ)(x) is linear in the Gaussian x. Returns [Σ_0, ..., Σ_L]."""
    out = [sigma]
    eye = torch.eye(sigma.shape[-1], dtype=sigma.dtype, device=sigma.device)
    for head in heads:
        m = eye + layer_readout(head, out[-1])
        out.append(m @ out[-1] @ m.T)
    return out


def estimate_covariances(hidden: list[Tensor], start: int) -> list[Tensor]:
    """Empirical covariances of each h^(ℓ) from one long independent run: positions ≥ `start`
    (where the hidden states have nearly reached equilibrium) of every stream, pooled, in float64."""
    out = []
    for h in hidden:
        tail = h[:, start:].reshape(-1, h.shape[-1]).double()
        out.append(torch.cov(tail.T))
    return out
