"""The stable variant's RMSNorm inversion (patching/app_b_inversion.py) on CUDA finds μ without a host round
trip per bisection step (each would wait for the GPU), and finds the same μ, to the last bit, as the plain
scalar bisection (kept here as the reference, and still what runs on the CPU). The chunked path is the one
CUDA takes; here it runs on CPU tensors with chunked=True."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.patching import app_b_inversion
from experiments.patching.app_b_inversion import multiplier_equation, rms_multiplier


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
        assert rms_multiplier(g, m, chunked=True) == scalar_bisection(g, m)
        assert rms_multiplier(g, m, chunked=False) == scalar_bisection(g, m)


def test_a_long_bisection_over_several_chunks_is_the_same_too(monkeypatch):
    monkeypatch.setattr(app_b_inversion, "BISECTION_CHUNK", 7)  # many look-ups between chunks
    g, m = _problem(0, 64)
    assert rms_multiplier(g, m, chunked=True) == scalar_bisection(g, m)


class _CountReads:
    """Counts what reads a tensor back to the host (float(), .item(), bool(), .nonzero())."""

    def __init__(self, monkeypatch):
        self.n = 0
        for name in ("__float__", "item", "__bool__", "nonzero"):
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _original=original, **kwargs):
                self.n += 1
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def test_no_host_round_trip_per_bisection_step(monkeypatch):
    g, m = _problem(1, 640)
    reads = _CountReads(monkeypatch)
    rms_multiplier(g, m, chunked=True)
    with_chunks = reads.n
    reads.n = 0
    scalar_bisection(g, m)
    per_step = reads.n
    assert per_step > 50  # the scalar version: one read per step
    assert with_chunks <= 10, with_chunks  # a handful, whatever the number of steps


def test_cuda_tensors_take_the_chunked_path(monkeypatch):
    taken = []
    monkeypatch.setattr(app_b_inversion, "_bisect_in_chunks", lambda *a: taken.append(1) or app_b_inversion._bisect(*a))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    g, m = _problem(2, 16)
    rms_multiplier(g, m)
    assert taken == [1]
