"""Stationary input streams (Xu & Fang App. B and Assumption 3.5).

Everything is sampled in float64 on the CPU from an explicit generator and cast afterwards, so a
seed names the same data whatever the run's dtype or device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def random_covariance_factor(d: int, generator: torch.Generator, batch: tuple[int, ...] = ()) -> Tensor:
    """B with i.i.d. N(0, 1/d) entries, so Σ = BBᵀ is positive definite (a.s.) with tr Σ ≈ d."""
    return torch.randn(*batch, d, d, generator=generator, dtype=torch.float64) / d**0.5


def gaussian_stream(factor: Tensor, length: int, generator: torch.Generator, streams: int = 1) -> Tensor:
    """i.i.d. x_t = B z_t, z_t ~ N(0, I): (streams, length, d); `factor` is B (d, d) or (streams, d, d)."""
    d = factor.shape[-1]
    z = torch.randn(streams, length, d, generator=generator, dtype=torch.float64)
    return z @ factor.transpose(-1, -2)


def linear_recurrence(innovations: Tensor, rho: float) -> Tensor:
    """a_t = ρ a_{t-1} + e_t along dim -2 (a_1 = e_1), vectorized over every other dimension.

    A Markov chain is sequential in time, so this steps through time in place on a time-major copy:
    each step touches one (streams, d) slab. (A log-depth doubling scan does the same in log2(T)
    passes but each pass streams the whole tensor through memory, which makes it far slower.)"""
    steps = innovations.movedim(-2, 0).contiguous()
    for t in range(1, steps.shape[0]):
        steps[t].add_(steps[t - 1], alpha=rho)
    return steps.movedim(0, -2)


def ar1_stream(factor: Tensor, length: int, rho: float, generator: torch.Generator, streams: int = 1) -> Tensor:
    """Stationary Gaussian AR(1): x_1 ~ N(0, Σ), x_t = ρ x_{t-1} + √(1-ρ²) B z_t, so every x_t ~ N(0, Σ)
    and Corr(x_t, x_{t+k}) = ρ^k: strongly mixing with α(k) ≤ |ρ|^k. ρ = 0 is the i.i.d. stream."""
    z = gaussian_stream(factor, length, generator, streams)
    if rho == 0:
        return z
    innovations = torch.cat([z[:, :1], (1 - rho**2) ** 0.5 * z[:, 1:]], dim=1)
    return linear_recurrence(innovations, rho)


@dataclass
class ICLTasks:
    """In-context linear regression tasks (App. B.2), one row per task."""

    u: Tensor  # (tasks, n, d_u) demonstration covariates u_j ~ N(0, Σ_uu)
    w: Tensor  # (tasks, n, d_w) noise-free targets w_j = βᵀ u_j
    u_query: Tensor  # (tasks, d_u) the query covariate u_t (its target slot is 0 in the prompt)
    sigma_uu: Tensor  # (tasks, d_u, d_u) diagonal, entries ~ U[low, high]
    beta: Tensor  # (tasks, d_u, d_w) i.i.d. standard Gaussian

    def to(self, dtype: torch.dtype, device=None) -> ICLTasks:
        return ICLTasks(*(t.to(device=device, dtype=dtype) for t in (self.u, self.w, self.u_query,
                                                                       self.sigma_uu, self.beta)))


def icl_tasks(tasks: int, n_demos: int, d_u: int, d_w: int, generator: torch.Generator,
              diag_low: float = 0.25, diag_high: float = 1.0, noise_std: float = 0.0) -> ICLTasks:
    """Fresh (Σ_uu, β) per task and n_demos i.i.d. demonstrations plus one query, all in float64.
    Σ_uu is diagonal, so its Cholesky factor is the elementwise square root of the diagonal."""
    diag = diag_low + (diag_high - diag_low) * torch.rand(tasks, d_u, generator=generator, dtype=torch.float64)
    beta = torch.randn(tasks, d_u, d_w, generator=generator, dtype=torch.float64)
    z = torch.randn(tasks, n_demos + 1, d_u, generator=generator, dtype=torch.float64)
    u_all = z * diag.sqrt().unsqueeze(1)
    u, u_query = u_all[:, :-1], u_all[:, -1]
    w = u @ beta
    if noise_std:
        w = w + noise_std * torch.randn(w.shape, generator=generator, dtype=torch.float64)
    return ICLTasks(u=u, w=w, u_query=u_query, sigma_uu=torch.diag_embed(diag), beta=beta)
