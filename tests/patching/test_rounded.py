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
    c = rounded.add_rank1_by_rows(W, lambda w, _g, rows, _slot: t[rows] - rounded.row_dot(w, y.view(1, -1), F64),
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



def _as_on_a_gpu(monkeypatch) -> None:
    """The kernels a GPU takes, run on the CPU: blocks handed over in their own dtype, coefficients as each row's
    product and sum, the update one addcmul."""
    monkeypatch.setattr(rounded, "_in_compute_dtype", lambda w, cdt: w)
    monkeypatch.setattr(rounded, "_cpu_kernels", lambda w, cdt: False)


def _bf16_case(seed: int, rows: int = 40, cols: int = 16, layers: int | None = None):
    shape = (rows, cols) if layers is None else (layers, rows, cols)
    W = _rand(*shape, seed=seed, dtype=torch.float32).bfloat16()
    dz = _rand(*shape[:-2], cols, seed=seed + 1, dtype=torch.float32)
    s = _rand(*shape[:-2], cols, seed=seed + 2, dtype=torch.float32)
    return W, dz, s


def _reference(W, dz, s):
    """Today's arithmetic with a whole float32 copy: c_i = W_i · dz, then W + c sᵀ in float32, rounded once."""
    Wf = W.float()
    c = (Wf * dz.unsqueeze(-2)).sum(-1)
    return torch.addcmul(Wf, c.unsqueeze(-1), s.unsqueeze(-2)).bfloat16(), c


@pytest.mark.parametrize("block_bytes", [3 * 16 * 4, 7 * 16 * 4, 1 << 21])
@pytest.mark.parametrize("as_on_a_gpu", [False, True])
def test_bfloat16_by_blocks_has_the_bits_of_the_whole_float32_update(monkeypatch, block_bytes, as_on_a_gpu):
    """Issue 54 item 4: no whole float32 copy, the same bits: blocks of 3 or 7 rows (a tail block) and the whole
    matrix, against the whole matrix converted to float32, updated and rounded once. `as_on_a_gpu`: the blocks
    handed to the kernels in bfloat16, as on CUDA, where the kernels convert as they read (and the coefficients
    are each row's own product and sum)."""
    monkeypatch.setattr(rounded, "CPU_BLOCK_BYTES", block_bytes)
    if as_on_a_gpu:
        _as_on_a_gpu(monkeypatch)
    W, dz, s = _bf16_case(11)
    out = torch.empty_like(W)
    c = rounded.add_rank1_by_rows(W, rounded.RowDot(dz.view(1, -1)), s, out, torch.float32)
    _, c_expected = _reference(W, dz, s)
    # with the coefficients it computed, by the kernel of that path (addr on the CPU, addcmul on a GPU)
    whole = W.float()
    expected = (torch.addcmul(whole, c.unsqueeze(-1), s) if as_on_a_gpu else whole.addr_(c, s)).bfloat16()
    assert torch.equal(out, expected)
    if as_on_a_gpu:  # each row's own product and sum: the whole matrix's bits
        assert torch.equal(c, c_expected)
    else:  # MKL's matrix-vector product by blocks: to float32's rounding
        torch.testing.assert_close(c, c_expected, rtol=1e-6, atol=1e-6)
    # control: rounding twice (the product to bfloat16 first, then the sum) gives other bits here
    twice = W + (c_expected.unsqueeze(-1) * s).bfloat16()
    assert not torch.equal(twice, expected)


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("as_on_a_gpu", [False, True])
def test_a_stack_of_layers_has_the_bits_of_one_layer_at_a_time(monkeypatch, dtype, as_on_a_gpu):
    """The open loop's batched update (W (L, out, in), a z per layer) is each layer's own, bit for bit; with the
    CPU's kernels (blocks of whole layers here, `mv` and `addr` a layer at a time) and with a GPU's (each row's own
    product and sum, one addcmul over the whole stack), run here."""
    if as_on_a_gpu:
        _as_on_a_gpu(monkeypatch)
    W, _, _ = _bf16_case(21, layers=4)
    W = W.to(dtype)
    z_c, z = _rand(4, 16, seed=22, dtype=torch.float32), _rand(4, 16, seed=23, dtype=torch.float32)
    cdt = rounded.compute_dtype(dtype)
    out = torch.empty_like(W)
    u = rounded.input_update_rounded(W, LINEAR, z_c, z, out, cdt)
    for layer in range(4):
        one = torch.empty_like(W[layer])
        u_one = rounded.input_update_rounded(W[layer], LINEAR, z_c[layer], z[layer], one, cdt)
        assert torch.equal(out[layer], one) and torch.equal(u[layer], u_one)
    # control: layer 0's z for every layer gives other coefficients
    assert not torch.equal(rounded.input_update_rounded(W, LINEAR, z_c[:1].expand(4, -1), z[:1].expand(4, -1),
                                                         torch.empty_like(W), cdt), u)


@pytest.mark.gpu
def test_on_a_gpu_bfloat16_is_updated_without_a_float32_copy(monkeypatch):
    """On CUDA the kernels read bfloat16 and compute in float32 themselves: beyond the matrix and its output, the
    update holds one block's float32 products (here 4 MiB of a 32 MiB float32 matrix), never a float32 copy; the
    output is W + c sᵀ computed in float32 and rounded once, with the coefficients it returns."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    monkeypatch.setattr(rounded, "GPU_BLOCK_BYTES", 4 << 20)
    W, dz, s = (t.cuda() for t in _bf16_case(31, rows=4096, cols=2048))
    out = torch.empty_like(W)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    c = rounded.add_rank1_by_rows(W, rounded.RowDot(dz.view(1, -1)), s, out, torch.float32)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra <= (4 << 20) + 4 * 4096 + (1 << 20), f"{extra} bytes beyond W: its float32 copy is {W.numel() * 4}"
    assert torch.equal(out, torch.addcmul(W.float(), c.unsqueeze(-1), s).bfloat16())
    torch.testing.assert_close(c, _reference(W, dz, s)[1], rtol=1e-5, atol=1e-5)
