"""The block-by-block rank-1 updates (rounded.py) against whole-matrix float64 arithmetic: every
layout, several row blocks, a coefficient that reads its own rows, and the single rounding to bfloat16."""

from __future__ import annotations

import pytest
import torch

from experiments.patching import lemmas, rounded
from experiments.patching.arch.base import CONV1D, EXPERTS, LINEAR

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

F64 = torch.float64


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(rounded, "CPU_BLOCK_BYTES", 3 * 16 * 8)  # 3 rows of 16 float64s: many uneven blocks


def _rand(*shape, seed, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("layout", [LINEAR, CONV1D, EXPERTS])
def test_input_update_by_blocks_equals_the_lemma_on_the_whole_matrix(layout):
    z_c, z = _rand(16, seed=1), _rand(16, seed=2)
    W = {LINEAR: _rand(20, 16, seed=3), CONV1D: _rand(16, 20, seed=3), EXPERTS: _rand(3, 20, 16, seed=3)}[layout]
    effective = W.T if layout == CONV1D else W  # the matrix that multiplies z
    out = torch.empty_like(W)
    rounded.input_update_rounded(W, layout, z_c, z, out, F64)
    patched = out.T if layout == CONV1D else out
    torch.testing.assert_close(patched @ z, effective @ z_c, rtol=1e-12, atol=1e-12)  # sees z_C through z
    u, s = lemmas.input_update(effective, z_c, z)
    torch.testing.assert_close(patched, effective + u.unsqueeze(-1) * s, rtol=1e-13, atol=1e-13)
    assert (effective @ z - effective @ z_c).abs().max() > 0.1  # control: the unpatched matrix does not


def test_a_coefficient_may_read_its_own_rows():
    """The outer-weight solve: c_i = t_i − W_i · y, so that (W + c yᵀ/‖y‖²) y = t, row by row."""
    W, y, t = _rand(23, 16, seed=4), _rand(16, seed=5), _rand(23, seed=6)
    out = torch.empty_like(W)
    c = rounded.add_rank1_by_rows(W, lambda w, rows: t[rows] - torch.mv(w, y),
                                  lemmas.outer_weight_direction(y), out, F64)
    torch.testing.assert_close(out @ y, t, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, t - W @ y, rtol=1e-12, atol=1e-12)
    assert (W @ y - t).abs().max() > 0.1


def test_bfloat16_weights_are_updated_in_float32_and_rounded_once():
    W = _rand(40, 16, seed=7, dtype=torch.float32).bfloat16()
    z_c, z = _rand(16, seed=8, dtype=torch.float32), _rand(16, seed=9, dtype=torch.float32)
    out = torch.empty_like(W)
    rounded.input_update_rounded(W, LINEAR, z_c, z, out, torch.float32)
    assert out.dtype == torch.bfloat16
    u, s = lemmas.input_update(W.double(), z_c.double(), z.double())
    exact = W.double() + torch.outer(u, s)
    # rounded once: at most half a bfloat16 ulp from the exact sum (plus float32's own error)
    ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.floor(torch.log2(exact.abs()))
    assert ((out.double() - exact).abs() <= 0.5 * ulp + 1e-5 * exact.abs()).all()
    assert (out.double() - W.double()).abs().max() > 0.1  # the update is there (control: W itself fails)

