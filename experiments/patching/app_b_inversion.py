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
    return float(_equation(gm_sq, m_sq, torch.as_tensor(mu, dtype=torch.float64, device=m_sq.device)))


def _equation(gm_sq: Tensor, m_sq: Tensor, mu: Tensor) -> Tensor:
    """F at every μ of `mu` (any shape), on the device."""
    return (gm_sq / (m_sq - mu[..., None]).square()).mean(-1) - 1.0


# The root is found by a K-ary search over float64's bit patterns (ordered as the floats they encode): each
# round evaluates F at POINTS candidates at once and keeps the two neighbours where it changes sign, so the
# search ends, as plain bisection does, at two adjacent floats with F(lo) < 0 ≤ F(hi). 2^64 patterns at
# 256 a round take 8 rounds; ROUNDS has one spare. The number of kernel launches is fixed (no loop reads
# anything back), whatever the number of bisection steps it replaces (about 60, up to 1100 for a far root).
POINTS = 256
ROUNDS = 9
DOUBLINGS = 1024  # candidate lower ends top − step·2^j, j < DOUBLINGS (up to float64's range), tried at once
_LOW_BITS = (1 << 63) - 1
_SIGN = -(1 << 63)


def _key(x: Tensor) -> Tensor:
    """A float64's bit pattern as an int64 ordered like the floats (−0 and +0 both 0)."""
    bits = x.view(torch.int64)
    return torch.where(bits < 0, -(bits & _LOW_BITS), bits)


def _value(key: Tensor) -> Tensor:
    return torch.where(key < 0, (-key) | _SIGN, key).view(torch.float64)


def rms_multiplier_tensor(g: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """(μ, no_root) as 0-d device tensors, with nothing read back to the host: the root of F on
    (−∞, min m²) in float64, or (min m², True) where F has none."""
    g, m = g.double(), m.double()
    gm_sq, m_sq = (g * m).square(), m.square()
    top = m_sq.min()
    below_top = torch.nextafter(top, torch.tensor(-math.inf, dtype=torch.float64, device=top.device))
    no_root = ~(_equation(gm_sq, m_sq, below_top) >= 0.0)  # F < 0 (or nan) up to the boundary
    lo, hi = _key(_lower_end(gm_sq, m_sq, top)), _key(below_top)  # invariant: F(lo) < 0 <= F(hi)
    steps = torch.arange(1, POINTS, dtype=torch.int64, device=m_sq.device)
    for _ in range(ROUNDS):
        width = torch.clamp(hi // POINTS - lo // POINTS, min=1)  # no int64 overflow across the sign
        keys = torch.minimum(lo + steps * width, hi)
        below = _equation(gm_sq, m_sq, _value(keys)) < 0.0
        lo = torch.where(below, keys, lo).max()  # F increases: the last candidate below 0 ...
        hi = torch.where(below, hi, keys).min()  # ... and the first at or above it
    lo_v, hi_v = _value(lo), _value(hi)
    pick = _equation(gm_sq, m_sq, lo_v).abs() < _equation(gm_sq, m_sq, hi_v).abs()
    mu = torch.where(no_root, top, torch.where(pick, lo_v, hi_v))
    return mu, no_root


def rms_multiplier(g: Tensor, m: Tensor) -> tuple[float, bool]:
    """(μ, no_root) read back: `rms_multiplier_tensor`'s, for callers outside a patched pass."""
    mu, no_root = rms_multiplier_tensor(g, m)
    values = torch.stack([mu, no_root.double()]).tolist()
    return values[0], bool(values[1])


def _lower_end(gm_sq: Tensor, m_sq: Tensor, top: Tensor) -> Tensor:
    """The first of top − step, top − 2·step, top − 4·step, ... where F < 0 (F → −1 at −∞), all tried in one
    evaluation."""
    step = torch.clamp(top.abs(), min=1.0)
    candidates = top - step * 2.0 ** torch.arange(DOUBLINGS, dtype=torch.float64, device=m_sq.device)
    candidates = torch.where(torch.isfinite(candidates), candidates, torch.finfo(torch.float64).min)
    negative = _equation(gm_sq, m_sq, candidates) < 0.0
    first = negative.to(torch.int8).argmax().reshape(1)  # the first negative (the last, most negative, if none)
    return candidates.index_select(0, first)[0]


def unit_rms_minimizer(g: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """argmin_y ‖y ⊙ m − g‖² subject to RMS(y) = 1 (float64), and whether F had no root (a 0-d bool
    tensor); both branches computed on the device and one selected, so nothing is read back."""
    g, m = g.double(), m.double()
    n = g.numel()
    mu, no_root = rms_multiplier_tensor(g, m)
    m_sq, gm = m.square(), g * m
    root = gm / (m_sq - mu)
    hard = m_sq == m_sq.min()  # K: where m_k² = min m² (the hard case's μ)
    rest = torch.where(hard, torch.zeros_like(g), gm / torch.where(hard, torch.ones_like(m_sq), m_sq - mu))
    budget = torch.clamp(n - rest.square().sum(), min=0.0)
    sign = torch.where(gm < 0, -1.0, 1.0).to(g)
    y_hard = torch.where(hard, sign * (budget / hard.sum()).sqrt(), rest)
    return torch.where(no_root, y_hard, root), no_root


def invert_rms_norm(g: Tensor, m: Tensor, target_rms: float | Tensor) -> tuple[Tensor, Tensor]:
    """InvertRMSNorm(g, m, C) of App. B.1: x with RMS(x) = C minimizing ‖m ⊙ x/RMS(x) − g‖²."""
    y, no_root = unit_rms_minimizer(g, m)
    return target_rms * y, no_root
