"""Table 1's controllability lemmas, each on random tensors in float64, beside a control that fails.

Each test builds a small block from plain tensor operations (independent of the lemma code) and checks
that the patched block without the context gives the block's output with the context."""

from __future__ import annotations

import pytest
import torch

from experiments.patching import lemmas

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

F64 = torch.float64


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=F64)


def _layer_norm(v):
    return (v - v.mean()) / v.std(unbiased=False)


def _mlp(W_in, W_out, b, z):
    return W_out @ torch.nn.functional.gelu(W_in @ z) + b


def test_input_update_moves_z_to_z_c_for_every_input_matrix_after_a_norm():
    """Thms 6–7: after a LayerNorm, (W + ΔW) N(v) = W N(v_C), for each matrix reading z (here two)."""
    g = _g(0)
    v_c, v = _randn(16, gen=g), _randn(16, gen=g)
    z_c, z = _layer_norm(v_c), _layer_norm(v)
    for W in (_randn(40, 16, gen=g), _randn(24, 16, gen=g)):
        u, s = lemmas.input_update(W, z_c, z)
        dW = torch.outer(u, s)
        torch.testing.assert_close((W + dW) @ z, W @ z_c, rtol=1e-12, atol=1e-12)
        assert torch.linalg.matrix_rank(dW) == 1
        assert (W @ z - W @ z_c).abs().max() > 0.1  # control: unpatched W does not
    with pytest.raises(ValueError, match="z = 0"):
        lemmas.input_update(W, z_c, torch.zeros(16, dtype=F64))


def test_input_update_is_batched_over_stacked_experts():
    g = _g(1)
    W = _randn(3, 10, 8, gen=g)
    z_c, z = _randn(8, gen=g), _randn(8, gen=g)
    u, s = lemmas.input_update(W, z_c, z)
    patched = W + u.unsqueeze(-1) * s
    for e in range(3):
        torch.testing.assert_close(patched[e] @ z, W[e] @ z_c, rtol=1e-12, atol=1e-12)


def test_outer_bias_absorbs_the_residual_change():
    """Thm 8: T = v + g(z) + b; with the MLP seeing z_C (input update) and b + Δb, v gives v_C's output."""
    g = _g(2)
    v_c, v = _randn(12, gen=g), _randn(12, gen=g)
    W_in, W_out, b = _randn(30, 12, gen=g), _randn(12, 30, gen=g), _randn(12, gen=g)
    z_c, z = _layer_norm(v_c), _layer_norm(v)
    u, s = lemmas.input_update(W_in, z_c, z)
    db = lemmas.outer_bias_update(v_c - v)
    want = v_c + _mlp(W_in, W_out, b, z_c)
    got = v + _mlp(W_in + torch.outer(u, s), W_out, b + db, z)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert (v + _mlp(W_in + torch.outer(u, s), W_out, b, z) - want).abs().max() > 0.1  # control: no Δb


def test_outer_weight_absorbs_the_residual_change_by_a_rank1_update():
    """Thm 9 (Llama's W_down): ΔW′ = r yᵀ / ‖y‖² with y = f(z_C), the outer matrix's input."""
    g = _g(3)
    v_c, v = _randn(12, gen=g), _randn(12, gen=g)
    W_gate, W_up, W_down = _randn(30, 12, gen=g), _randn(30, 12, gen=g), _randn(12, 30, gen=g)
    z_c, z = _layer_norm(v_c), _layer_norm(v)

    def swiglu(Wg, Wu, Wd, x):
        return Wd @ (torch.nn.functional.silu(Wg @ x) * (Wu @ x))

    ug, sg = lemmas.input_update(W_gate, z_c, z)
    uu, su = lemmas.input_update(W_up, z_c, z)
    y = torch.nn.functional.silu(W_gate @ z_c) * (W_up @ z_c)
    uo, so = lemmas.outer_weight_update(v_c - v, y)
    got = v + swiglu(W_gate + torch.outer(ug, sg), W_up + torch.outer(uu, su), W_down + torch.outer(uo, so), z)
    torch.testing.assert_close(got, v_c + swiglu(W_gate, W_up, W_down, z_c), rtol=1e-12, atol=1e-12)
    assert torch.linalg.matrix_rank(torch.outer(uo, so)) == 1


def test_elementwise_scale_absorbs_the_residual_change_and_counts_unmovable_coordinates():
    """Thm 10 (Gemma's post-MLP RMSNorm scale): v + (m + Δm) ⊙ h = v_C + m ⊙ h."""
    g = _g(4)
    v_c, v, h, m = (_randn(20, gen=g) for _ in range(4))
    dm, n_zero = lemmas.scale_update(v_c - v, h)
    assert n_zero == 0
    torch.testing.assert_close(v + (m + dm) * h, v_c + m * h, rtol=1e-12, atol=1e-12)
    h[5] = 0.0
    dm, n_zero = lemmas.scale_update(v_c - v, h)
    assert n_zero == 1 and dm[5] == 0.0  # Lemma 10: a zero of h cannot be moved by a scale


def test_moe_each_active_expert_adds_its_share():
    """Thm 11: router gates g_j (not normalized: S ≠ 1), each expert's outer weight adds r / S."""
    g = _g(5)
    n, k = 12, 3
    v_c, v = _randn(n, gen=g), _randn(n, gen=g)
    W_outs = [_randn(n, 20, gen=g) for _ in range(k)]
    ys = _randn(k, 20, gen=g)
    gates = torch.rand(k, generator=g, dtype=F64) + 0.1
    factors = lemmas.moe_updates(v_c - v, gates, ys)
    mix = sum(gj * (W + torch.outer(u, s)) @ y for gj, W, (u, s), y in zip(gates, W_outs, factors, ys, strict=True))
    plain = sum(gj * W @ y for gj, W, y in zip(gates, W_outs, ys, strict=True))
    torch.testing.assert_close(v + mix, v_c + plain, rtol=1e-12, atol=1e-12)
    wrong = lemmas.moe_updates(v_c - v, torch.ones(k, dtype=F64), ys)  # control: shares ignoring S
    mix_wrong = sum(gj * (W + torch.outer(u, s)) @ y for gj, W, (u, s), y in zip(gates, W_outs, wrong, ys,
                                                                                 strict=True))
    assert (v + mix_wrong - v_c - plain).abs().max() > 1e-3


def test_parallel_block_puts_the_whole_attention_change_into_the_mlp_output():
    """Thm 12: T = x + A + g(LN(x)); the MLP input has no context, so Δb = A_C − A makes T exact."""
    g = _g(6)
    x, a_c, a = _randn(12, gen=g), _randn(12, gen=g), _randn(12, gen=g)
    W_in, W_out, b = _randn(30, 12, gen=g), _randn(12, 30, gen=g), _randn(12, gen=g)
    r = lemmas.parallel_block_residual(a_c, a)
    want = x + a_c + _mlp(W_in, W_out, b, _layer_norm(x))
    got = x + a + _mlp(W_in, W_out, b + lemmas.outer_bias_update(r), _layer_norm(x))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert (x + a + _mlp(W_in, W_out, b, _layer_norm(x)) - want).abs().max() > 0.1  # control
