"""The fixed patch's least-squares lemmas alone, in float64 (exactness, rank, k = 1 is Table 1's rank-1
update, and a control that fails), and the closed-loop fit on tiny random models."""

from __future__ import annotations

import pytest
import torch

from experiments.patching import lemmas
from experiments.patching.families import tiny_models
from experiments.patching.lemmas_ls import (
    input_update_ls,
    moe_features,
    moe_ls,
    outer_bias_ls,
    outer_weight_ls,
    relative_residual,
    scale_ls,
)

F64 = torch.float64


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_input_update_is_exact_at_k_independent_positions_with_rank_at_most_k():
    g = _g()
    W = torch.randn(12, 8, generator=g, dtype=F64)
    Z, Z_c = torch.randn(5, 8, generator=g, dtype=F64), torch.randn(5, 8, generator=g, dtype=F64)
    dW = input_update_ls(W, Z_c, Z)
    assert ((W + dW) @ Z.T - W @ Z_c.T).abs().max() < 1e-12
    assert torch.linalg.matrix_rank(dW) <= 5
    # batched over experts (E, out, in): each expert's map is matched
    We = torch.randn(3, 6, 8, generator=g, dtype=F64)
    dWe = input_update_ls(We, Z_c, Z)
    assert ((We + dWe) @ Z.T - We @ Z_c.T).abs().max() < 1e-12


def test_input_update_with_one_position_is_theorem_6():
    g = _g(1)
    W = torch.randn(12, 8, generator=g, dtype=F64)
    z, z_c = torch.randn(8, generator=g, dtype=F64), torch.randn(8, generator=g, dtype=F64)
    u, s = lemmas.input_update(W, z_c, z)
    assert (input_update_ls(W, z_c[None], z[None]) - torch.outer(u, s)).abs().max() < 1e-12


def test_input_update_control_more_positions_than_coordinates_is_not_exact():
    """k > d: the z's are dependent and their targets are not: no matrix can match them all."""
    g = _g(2)
    W = torch.randn(12, 8, generator=g, dtype=F64)
    Z, Z_c = torch.randn(10, 8, generator=g, dtype=F64), torch.randn(10, 8, generator=g, dtype=F64)
    dW = input_update_ls(W, Z_c, Z)
    assert ((W + dW) @ Z.T - W @ Z_c.T).abs().max() > 1e-2


def test_outer_weight_is_exact_at_k_positions_and_k1_is_theorem_9():
    g = _g(3)
    R, Y = torch.randn(6, 10, generator=g, dtype=F64), torch.randn(6, 16, generator=g, dtype=F64)
    dW = outer_weight_ls(R, Y)
    assert (Y @ dW.T - R).abs().max() < 1e-12 and torch.linalg.matrix_rank(dW) <= 6
    u, s = lemmas.outer_weight_update(R[0], Y[0])
    assert (outer_weight_ls(R[:1], Y[:1]) - torch.outer(u, s)).abs().max() < 1e-12
    # control: more positions than the outer matrix has inputs
    R2, Y2 = torch.randn(20, 10, generator=g, dtype=F64), torch.randn(20, 16, generator=g, dtype=F64)
    assert (Y2 @ outer_weight_ls(R2, Y2).T - R2).abs().max() > 1e-2


def test_moe_is_exact_at_k_positions_with_each_positions_own_experts():
    g = _g(4)
    k, E, n, d = 5, 4, 6, 7
    ys = torch.randn(k, E, n, generator=g, dtype=F64)
    a = torch.zeros(k, E, dtype=F64)
    for i in range(k):  # two experts per position, softmax-like weights
        picked = torch.randperm(E, generator=g)[:2]
        a[i, picked] = torch.tensor([0.7, 0.3], dtype=F64)
    R = torch.randn(k, d, generator=g, dtype=F64)
    dW = moe_ls(R, moe_features(ys, a), E)  # (E, d, n)
    moved = torch.einsum("ke,edn,ken->kd", a, dW, ys)
    assert (moved - R).abs().max() < 1e-12
    # an expert no position picked is left alone (minimum norm)
    a[:, 0] = 0.0
    dW = moe_ls(R, moe_features(ys, a), E)
    assert dW[0].abs().max() < 1e-14


def test_bias_least_squares_is_exact_only_at_one_position():
    g = _g(5)
    R = torch.randn(4, 6, generator=g, dtype=F64)
    db = outer_bias_ls(R)
    assert (R - db).sum(0).abs().max() < 1e-12  # normal equations: the residual sums to zero
    assert relative_residual(R, db.expand_as(R)) > 0.1  # control: 4 different r's, one bias
    assert relative_residual(R[:1], outer_bias_ls(R[:1]).expand_as(R[:1])) < 1e-15  # Thm 8


def test_scale_least_squares_normal_equations_and_k1_is_theorem_10():
    g = _g(6)
    R, H = torch.randn(4, 6, generator=g, dtype=F64), torch.randn(4, 6, generator=g, dtype=F64)
    H[:, 2] = 0.0  # a coordinate no scale can move
    dm = scale_ls(R, H)
    assert dm[2] == 0.0
    assert (H * (R - H * dm)).sum(0).abs().max() < 1e-12  # normal equations per coordinate
    assert relative_residual(R, H * dm) > 0.1  # control: k = 4 positions, d parameters
    h, r = torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64)
    want, _ = lemmas.scale_update(r, h)
    assert (scale_ls(r[None], h[None]) - want).abs().max() < 1e-12


# -- the closed-loop fit on tiny random models --------------------------------------------------------
def _fit_and_check(name: str, k: int, dtype=torch.float64):
    from experiments.patching.arch import adapter_for
    from experiments.patching.fixed_patch import capture_targets, fit_fixed_patch, layer_outputs
    from experiments.patching.load import load_checked

    model = load_checked(name, dtype, "cpu", seed=0).model
    adapter = adapter_for(model.config.model_type)
    g = _g(7)
    full = torch.randint(10, 200, (1, 12), generator=g)  # a "prompt" of 6 and a "reply" of 6
    nc = torch.cat([torch.tensor([[2]]), full[:, 6:6 + k - 1]], 1)
    _, targets = capture_targets(model, adapter, full, 5, k)
    patch = fit_fixed_patch(model, adapter, nc, targets)
    _, outs = layer_outputs(model, adapter, nc)  # a stock forward of the patched weights
    errors = [float((o - t).abs().max() / t.abs().max()) for o, t in zip(outs, targets.out, strict=True)]
    fitted = patch.scaled(model, 1.01)
    _, outs = layer_outputs(model, adapter, nc)
    perturbed = max(float((o - t).abs().max() / t.abs().max()) for o, t in zip(outs, targets.out, strict=True))
    for name_, t in fitted.items():
        model.get_parameter(name_).data.copy_(t)
    patch.restore(model)
    restored = all(torch.equal(model.get_parameter(n), o) for n, o in patch.originals.items())
    return errors, perturbed, patch, restored


def _exact_k(name: str) -> int:
    """The positions a family's fit can match exactly: several for a matrix rule, one for a vector rule."""
    from experiments.patching.arch import TINY_MODELS

    return 5 if TINY_MODELS[name].rule.exact_at_k else 1


@pytest.mark.parametrize("name", tiny_models())
def test_closed_loop_fit_is_exact_at_the_fitted_positions_in_float64(name):
    k = _exact_k(name)
    errors, perturbed, patch, restored = _fit_and_check(name, k)
    assert max(errors) < 1e-6, errors  # float64 apart from transformers' float32 norm casts
    assert perturbed > 1e-4  # control: a fit changed by 1 % is visibly off
    assert all(f.rank == k for f in patch.layers)
    assert restored


def test_bias_rule_cannot_match_several_positions():
    """GPT-2's outer bias at k = 4: the input side is exact, the output side leaves its LS residual."""
    errors, _, patch, _ = _fit_and_check("tiny-gpt2", 4)
    assert all(f.input_rel < 1e-9 for f in patch.layers)
    assert min(f.output_residual for f in patch.layers) > 1e-3
    assert max(errors) > 1e-3
