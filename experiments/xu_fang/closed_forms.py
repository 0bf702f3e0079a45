"""Closed forms for Gaussian inputs, the references the experiments are read against.

For x ~ N(0, Σ), Λ(u) = ½ uᵀΣu, so ∇Λ(u) = Σu and Thm 3.2 gives m_x(q) = Σ Θ_Kᵀ q / √d_k:
Thm 3.4's positive scalar is γ_Σ(q) = 1/√d_k whatever q (App. B.2 uses this to rescale by √d_u).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def gamma_gaussian(d_k: int) -> float:
    """γ_Σ(q) of Thm 3.4 for Gaussian inputs: 1/√d_k, independent of q and Σ."""
    return 1.0 / math.sqrt(d_k)


def tilted_mean_gaussian(sigma: Tensor, theta_k: Tensor, q: Tensor) -> Tensor:
    """m_x(q) = Σ Θ_Kᵀ q / √d_k for x ~ N(0, Σ); q (..., d_k) -> (..., d)."""
    d_k = theta_k.shape[-2]
    return (q @ theta_k) @ sigma.transpose(-1, -2) * gamma_gaussian(d_k)


def tilt_variance(sigma: Tensor, theta_k: Tensor, q: Tensor) -> Tensor:
    """Var of the logit qᵀΘ_K x/√d_k over x ~ N(0, Σ): qᵀΘ_KΣΘ_Kᵀq / d_k. Thm 3.6 asks for ≤ 1."""
    p = q @ theta_k
    return ((p @ sigma) * p).sum(-1) / theta_k.shape[-2]


def iid_rate_constant(sigma: Tensor, theta_k: Tensor, q: Tensor) -> Tensor:
    """lim_n n·E‖X̄_n(q) − m_x(q)‖² for i.i.d. x ~ N(0, Σ) (our delta-method derivation, not the paper's).

    X̄_n − m ≈ (1/n) Σ_j w_j (x_j − m) / E w with w = e^{pᵀx/√d_k}, so the constant is
    E[w²‖x−m‖²]/(E w)². Under the weight w² the law of x is N(2m, Σ), and E[w²]/(E w)² = e^v with v
    the tilt variance: the constant is e^v (tr Σ + ‖m‖²). Thm 3.6's C₁ τ_α tr Σ with τ_α = 1, made explicit.
    """
    m = tilted_mean_gaussian(sigma, theta_k, q)
    trace = torch.diagonal(sigma, dim1=-2, dim2=-1).sum(-1)
    return torch.exp(tilt_variance(sigma, theta_k, q)) * (trace + (m * m).sum(-1))


def tau_alpha_ar1_bound(rho: float) -> float:
    """τ_α = 1 + 2 Σ_k √α(k) with the Gaussian AR(1) bound α(k) ≤ |ρ|^k: 1 + 2√|ρ|/(1 − √|ρ|)."""
    r = math.sqrt(abs(rho))
    return 1.0 + 2.0 * r / (1.0 - r)


def sigma_wu(beta: Tensor, sigma_uu: Tensor) -> Tensor:
    """Cov(w, u) = βᵀ Σ_uu for w = βᵀu + ε, ε ⊥ u (Cor. 4.1). beta (..., d_u, d_w) -> (..., d_w, d_u)."""
    return beta.transpose(-1, -2) @ sigma_uu
