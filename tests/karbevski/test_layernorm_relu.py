"""App. 8.2 (LayerNorm semi-conjugacy, Thm 8.2, Remark 5) and App. 8.4 (ReLU skip absorption) alone,
in float64, each with a control that fails."""

from __future__ import annotations

import pytest
import torch

from experiments.karbevski import layernorm_basis as lnb
from experiments.karbevski import relu_skip as rs

EPS = 1e-5


@pytest.fixture
def g():
    return torch.Generator().manual_seed(1)


def gauss(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def test_layer_norm_inverse_is_the_zero_mean_preimage(g):
    x = gauss(g, 50, 10)
    z = lnb.layer_norm(x, EPS)
    c = lnb.layer_norm_inverse(z, EPS)
    assert c.mean(-1).abs().max() < 1e-12
    assert torch.allclose(c, x - x.mean(-1, keepdim=True), rtol=1e-8, atol=1e-10)


def test_m0_preserves_zero_mean_subspace_with_unit_norm(g):
    m0, d_tilde = lnb.semi_conjugacy_matrix(gauss(g, 10, 10))
    q = lnb.zero_mean_basis(10)
    assert (torch.ones(10, dtype=torch.float64) @ m0 @ q).abs().max() < 1e-12  # M₀(H) ⊂ H
    assert torch.linalg.matrix_norm(q.T @ m0 @ q, ord=2).item() == pytest.approx(1.0, abs=1e-12)


def test_lemma81_semi_conjugacy_holds_for_any_mean_shift(g):
    a, x = gauss(g, 10, 10), 3 * gauss(g, 200, 10)
    m0, _ = lnb.semi_conjugacy_matrix(a)
    lhs = lnb.layer_norm(lnb.semi_conjugate(x, m0, EPS, shift=gauss(g, 200)), EPS)
    assert (lhs - lnb.layer_norm(x, EPS) @ m0.T).abs().max() < 1e-11
    plain = a / torch.linalg.matrix_norm(a, ord=2)  # without Diag(v): leaves H
    control = lnb.layer_norm(lnb.semi_conjugate(x, plain, EPS), EPS)
    assert (control - lnb.layer_norm(x, EPS) @ plain.T).abs().max() > 1e-2


def test_thm82_mlp_prime_carries_the_basis_change_and_a_linear_fix_does_not(g):
    d = 10
    theta, x = gauss(g, d, d) / d**0.5, gauss(g, 100, d)
    scale = torch.diag(torch.rand(d, generator=g, dtype=torch.float64) + 0.5)
    w1, w2 = gauss(g, d, 4 * d) / d**0.5, gauss(g, 4 * d, d) / (2 * d**0.5)

    def mlp(z):
        return torch.nn.functional.gelu(z @ w1) @ w2

    m0, d_tilde = lnb.semi_conjugacy_matrix(theta @ scale)
    target = lnb.layer_norm(x + mlp(x), EPS) @ (theta @ scale).T
    new = lnb.layer_norm(x + lnb.thm82_mlp_prime(x, mlp, m0, EPS), EPS) / torch.diagonal(d_tilde)
    assert (new - target).abs().max() / target.abs().max() < 1e-10
    linear_fix = lnb.layer_norm((x + mlp(x)) @ (theta @ scale).T, EPS)
    assert (linear_fix - target).abs().max() / target.abs().max() > 1e-2


def test_remark5_linearity_improves_with_dimension(g):
    small = lnb.linearity_deviation(8, 64, g, EPS, 1.0)
    large = lnb.linearity_deviation(128, 512, g, EPS, 1.0)
    assert large["deviation"] < 0.5 * small["deviation"]
    assert large["coefficient_cv"] < small["coefficient_cv"]


def test_thm83_absorbs_the_skip_when_the_condition_holds(g):
    w1, w2, j = rs.absorbable_pair(3, 7, 4, g)
    assert rs.condition_residual(w1, w2, j) < 1e-12
    x = gauss(g, 1000, 3)
    v1, v2 = rs.absorb_skip(w1, w2, j)
    assert (rs.skip_relu_mlp(x, w1, w2) - rs.relu_mlp(x, v1, v2)).abs().max() < 1e-12
    gw1, gw2 = gauss(g, 7, 3), gauss(g, 3, 7)  # generic: the condition fails, so does the recipe
    assert (rs.skip_relu_mlp(x, gw1, gw2) - rs.relu_mlp(x, *rs.absorb_skip(gw1, gw2, j))).abs().max() > 1e-1


def test_cor841_no_kink_aligned_fit_for_a_generic_pair(g):
    x = gauss(g, 800, 2)
    gw1, gw2 = gauss(g, 5, 2), gauss(g, 2, 5)
    assert rs.best_kink_aligned_fit(gw1, gw2, x)["relative_residual"] > 1e-2
    w1, w2, j = rs.absorbable_pair(2, 5, 3, g)
    best = rs.best_kink_aligned_fit(w1, w2, x)
    assert best["relative_residual"] < 1e-12
    assert [i for i, s in enumerate(best["signs"]) if s < 0] == j  # the search finds Thm 8.3's J


def test_lemma84_abs_features_independent_unless_collinear(g):
    w1, x = gauss(g, 6, 3), gauss(g, 2000, 3)
    assert rs.abs_features_conditioning(w1, x) > 1e-2
    collinear = torch.cat([w1[:-1], -2.0 * w1[:1]])
    assert rs.abs_features_conditioning(collinear, x) < 1e-12
