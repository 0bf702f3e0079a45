"""Goldwaser et al. App. B: the numerically stable update's RMSNorm inversion.

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


def rms_multiplier(g: Tensor, m: Tensor) -> tuple[float, bool]:
    """(μ, no_root): the root of F on (−∞, min m²) by bisection in float64, or (min m², True)."""
    g, m = g.double(), m.double()
    gm_sq, m_sq = (g * m).square(), m.square()
    top = float(m_sq.min())
    below_top = math.nextafter(top, -math.inf)
    f_top = multiplier_equation(gm_sq, m_sq, below_top)
    if not f_top >= 0.0:  # F < 0 (or nan) up to the boundary: no root in I
        return top, True
    step = max(1.0, abs(top))
    lo = top - step
    while multiplier_equation(gm_sq, m_sq, lo) >= 0.0:  # F → −1 at −∞: this ends
        step *= 2.0
        lo = top - step
    hi = below_top  # invariant: F(lo) < 0 <= F(hi)
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:  # adjacent floats: as close as float64 gets
            break
        if multiplier_equation(gm_sq, m_sq, mid) < 0.0:
            lo = mid
        else:
            hi = mid
    f_lo, f_hi = multiplier_equation(gm_sq, m_sq, lo), multiplier_equation(gm_sq, m_sq, hi)
    return (lo if abs(f_lo) < abs(f_hi) else hi), False


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
