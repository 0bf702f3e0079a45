"""Goldwaser et al. App. B: the numerically stable update's RMSNorm inversion (used by app_b.py).

Find y ∈ ℝⁿ with RMS(y) = 1 that makes m ⊙ y closest to a target g (Eqs. 5–6):

    minimize Σ_k (y_k m_k − g_k)²   subject to   (1/n) Σ_k y_k² = 1.

Lagrange gives y_k = g_k m_k / (m_k² − μ) (Eq. 7) with μ the root of
F(μ) = (1/n) Σ_k (g_k m_k)² / (m_k² − μ)² − 1 (Eq. 8) on I = (−∞, min_k m_k²). F is increasing on I
and tends to −1 at −∞, so there is exactly one root when F → +∞ at the right end, which is the case
when some k with m_k² = min m² has g_k m_k ≠ 0. Otherwise (e.g. a scale m_k = 0, or g_k = 0 where
m_k² is smallest) F stays finite and may stay below 0 on all of I: no root.

What we do then, and why it is principled: the problem is the minimum of a quadratic on a sphere
(a trust-region subproblem with an equality constraint). Its global minimizers satisfy
(diag(m²) − μ) y = g ⊙ m with diag(m²) − μ ⪰ 0, i.e. μ ≤ min m². With no root inside I, μ = min m²
itself (the "hard case"): the coordinates K where m_k² = min m² get the RMS budget that the others
leave, n − Σ_{k∉K} y_k², split evenly, each with the sign of g_k m_k (+ when 0). This is still the
exact minimizer (tested against brute force), so the inversion is always defined; callers count it.
The same branch is taken when a root exists in exact arithmetic but lies closer to min m² than
float64 can resolve (F is still negative at the last float below min m²).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def multiplier_equation(gm_sq: Tensor, m_sq: Tensor, mu: float) -> float:
    """F(μ) of Eq. 8, from (g_k m_k)² and m_k² (float64)."""
    return float((gm_sq / (m_sq - mu).square()).mean()) - 1.0


# On CUDA the bisection steps run on the device between two looks from the host (one synchronization per
# chunk, not per step): a root of ordinary size needs about 60 steps; steps after convergence change nothing.
# On the CPU reading a scalar costs nothing, and the plain loop is ten times faster than the chunked one.
BISECTION_CHUNK = 96
DOUBLINGS = 64  # candidate lower ends top − step·2^j, j < DOUBLINGS, tried at once


def rms_multiplier(g: Tensor, m: Tensor, chunked: bool | None = None) -> tuple[float, bool]:
    """(μ, no_root): the root of F on (−∞, min m²) by bisection in float64, or (min m², True).
    `chunked` (default: on CUDA) runs the steps in chunks without reading back in between; the steps are
    those of the plain loop, so μ is the same to the last bit."""
    g, m = g.double(), m.double()
    gm_sq, m_sq = (g * m).square(), m.square()
    top = float(m_sq.min())
    below_top = math.nextafter(top, -math.inf)
    f_top = multiplier_equation(gm_sq, m_sq, below_top)
    if not f_top >= 0.0:  # F < 0 (or nan) up to the boundary: no root in I
        return top, True
    lo = _lower_end(gm_sq, m_sq, top)
    bisect = _bisect_in_chunks if (g.is_cuda if chunked is None else chunked) else _bisect
    lo, hi = bisect(gm_sq, m_sq, lo, below_top)  # invariant: F(lo) < 0 <= F(hi)
    f_lo, f_hi = multiplier_equation(gm_sq, m_sq, lo), multiplier_equation(gm_sq, m_sq, hi)
    return (lo if abs(f_lo) < abs(f_hi) else hi), False


def _bisect(gm_sq: Tensor, m_sq: Tensor, lo: float, hi: float) -> tuple[float, float]:
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:  # adjacent floats: as close as float64 gets
            return lo, hi
        if multiplier_equation(gm_sq, m_sq, mid) < 0.0:
            lo = mid
        else:
            hi = mid


def _bisect_in_chunks(gm_sq: Tensor, m_sq: Tensor, lo: float, hi: float) -> tuple[float, float]:
    """The steps of `_bisect` on the device, BISECTION_CHUNK at a time, the host looking only in between."""
    lo_t, hi_t = (torch.tensor(x, dtype=torch.float64, device=m_sq.device) for x in (lo, hi))
    while True:
        for _ in range(BISECTION_CHUNK):
            mid = 0.5 * (lo_t + hi_t)
            moving = (mid > lo_t) & (mid < hi_t)  # else adjacent floats: this step changes nothing
            below = (gm_sq / (m_sq - mid).square()).mean() - 1.0 < 0.0
            lo_t = torch.where(moving & below, mid, lo_t)
            hi_t = torch.where(moving & ~below, mid, hi_t)
        lo, hi = float(lo_t), float(hi_t)
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return lo, hi


def _lower_end(gm_sq: Tensor, m_sq: Tensor, top: float) -> float:
    """The first of top − step, top − 2·step, top − 4·step, ... where F < 0 (F → −1 at −∞), all tried in one
    evaluation."""
    step = max(1.0, abs(top))
    candidates = top - step * 2.0 ** torch.arange(DOUBLINGS, dtype=torch.float64, device=m_sq.device)
    negative = ((gm_sq / (m_sq - candidates[:, None]).square()).mean(-1) - 1.0 < 0.0).nonzero()
    if len(negative):
        return float(candidates[negative[0, 0]])
    step *= 2.0 ** DOUBLINGS  # |g·m| beyond 2^64·step: go on one at a time
    while multiplier_equation(gm_sq, m_sq, top - step) >= 0.0:
        step *= 2.0
    return top - step


def unit_rms_minimizer(g: Tensor, m: Tensor) -> tuple[Tensor, bool]:
    """argmin_y ‖y ⊙ m − g‖² subject to RMS(y) = 1 (float64), and whether F had no root."""
    g, m = g.double(), m.double()
    n = g.numel()
    mu, no_root = rms_multiplier(g, m)
    m_sq = m.square()
    if not no_root:
        return g * m / (m_sq - mu), False
    hard = m_sq == mu  # K: where m_k² = min m²
    y = torch.zeros_like(g)
    y[~hard] = (g * m)[~hard] / (m_sq[~hard] - mu)
    budget = max(n - float(y.square().sum()), 0.0)
    sign = torch.where((g * m)[hard] < 0, -1.0, 1.0).to(g)
    y[hard] = sign * math.sqrt(budget / int(hard.sum()))
    return y, True


def invert_rms_norm(g: Tensor, m: Tensor, target_rms: float) -> tuple[Tensor, bool]:
    """InvertRMSNorm(g, m, C) of App. B.1: x with RMS(x) = C minimizing ‖m ⊙ x/RMS(x) − g‖²."""
    y, no_root = unit_rms_minimizer(g, m)
    return target_rms * y, no_root
