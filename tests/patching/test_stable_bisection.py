"""The stable variant's RMSNorm inversion (patching/app_b_inversion.py) finds μ with nothing read back to the
host and a fixed number of kernel launches (a K-ary search over float64's bit patterns), and finds the same μ,
to the last bit, as the plain scalar bisection (kept here as the reference)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.patching.app_b_inversion import multiplier_equation, rms_multiplier, rms_multiplier_tensor


def scalar_bisection(g: torch.Tensor, m: torch.Tensor) -> tuple[float, bool]:
    """The scalar version: one F evaluation read back to the host per step."""
    g, m = g.double(), m.double()
    gm_sq, m_sq = (g * m).square(), m.square()
    top = float(m_sq.min())
    below_top = math.nextafter(top, -math.inf)
    if not multiplier_equation(gm_sq, m_sq, below_top) >= 0.0:
        return top, True
    step = max(1.0, abs(top))
    lo = top - step
    while multiplier_equation(gm_sq, m_sq, lo) >= 0.0:
        step *= 2.0
        lo = top - step
    hi = below_top
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if multiplier_equation(gm_sq, m_sq, mid) < 0.0:
            lo = mid
        else:
            hi = mid
    f_lo, f_hi = multiplier_equation(gm_sq, m_sq, lo), multiplier_equation(gm_sq, m_sq, hi)
    return (lo if abs(f_lo) < abs(f_hi) else hi), False


def _problem(seed: int, n: int, g_scale: float = 1.0, m_scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen, dtype=torch.float64) * g_scale
    m = torch.randn(n, generator=gen, dtype=torch.float64) * m_scale
    return g, m


@pytest.mark.parametrize(("n", "g_scale", "m_scale"), [(3, 1, 1), (640, 1, 1), (640, 1e3, 1), (640, 1e-3, 1),
                                                       (2048, 1, 1e-4), (640, 1e12, 1), (5, 1, 1e3)])
def test_same_multiplier_as_the_scalar_bisection(n, g_scale, m_scale):
    for seed in range(5):
        g, m = _problem(seed, n, g_scale, m_scale)
        assert rms_multiplier(g, m) == scalar_bisection(g, m)


def test_no_root_is_the_hard_case_boundary():
    g, m = torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([0.5, 2.0], dtype=torch.float64)
    mu, no_root = rms_multiplier(g, m)
    assert (mu, no_root) == scalar_bisection(g, m) == (0.25, True)


class _CountOps(TorchDispatchMode):
    """Counts the aten ops run (each a kernel launch on a GPU) and the reads back to the host."""

    def __init__(self):
        super().__init__()
        self.ops = self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def _bisection_steps(g, m) -> int:
    """How many steps the scalar bisection takes on this problem (its host reads, less the fixed ones)."""
    count = _CountOps()
    with count:
        scalar_bisection(g, m)
    return count.reads


def test_no_host_read_and_launches_that_do_not_grow_with_the_bisection_steps():
    problems = [_problem(1, 640), _problem(0, 640, 1e12, 1), _problem(3, 5, 1, 1e3)]
    steps = [_bisection_steps(g, m) for g, m in problems]
    assert max(steps) > 1.5 * min(steps)  # problems of different lengths for the scalar version
    ops = []
    for g, m in problems:
        count = _CountOps()
        with count:
            rms_multiplier_tensor(g, m)
        assert count.reads == 0
        ops.append(count.ops)
    assert len(set(ops)) == 1, ops
