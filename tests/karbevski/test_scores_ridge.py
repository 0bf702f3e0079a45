"""App. 8.1's score derivation against sampled scores, and the streaming ridge and App. 8.3 targets."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.karbevski.attention_scores import closed_form_std, head_scores, layernorm_rows, unit_norm_rows
from experiments.karbevski.basis_targets import BasisTarget, SkipGeluMLP, mean_cosine_distance, relative_sq_error
from experiments.karbevski.ridge import StreamingRidge


def test_paper_numbers_from_the_closed_form():
    base, reduced = closed_form_std(0.02, 768, 12)
    assert base == pytest.approx(0.0032) and reduced == pytest.approx(0.02 / math.sqrt(12))
    assert reduced / base == pytest.approx(1 / (0.02 * math.sqrt(768)))  # ≈ 1.80, independent of heads
    assert closed_form_std(0.02, 768, 4)[1] / closed_form_std(0.02, 768, 4)[0] == pytest.approx(reduced / base)


def test_identity_query_is_the_coordinate_slice():
    g = torch.Generator().manual_seed(0)
    x, w_k = torch.randn(2, 5, 12, generator=g), torch.randn(12, 12, generator=g)
    scores = head_scores(x, None, w_k, 3)
    head1 = x[..., 4:8] @ (x @ w_k)[..., 4:8].transpose(-1, -2)
    assert torch.allclose(scores[:, 1], head1, atol=1e-6)
    assert torch.allclose(head_scores(x, torch.eye(12), w_k, 3), scores, atol=1e-6)


def test_sampled_score_std_matches_the_derivation():
    g = torch.Generator().manual_seed(0)
    d, heads, sigma = 256, 4, 0.02
    x = unit_norm_rows(8, 32, d, g)
    w_q, w_k = torch.randn(d, d, generator=g) * sigma, torch.randn(d, d, generator=g) * sigma
    base, reduced = closed_form_std(sigma, d, heads)
    assert head_scores(x, w_q, w_k, heads).std().item() == pytest.approx(base, rel=0.05)
    assert head_scores(x, None, w_k, heads).std().item() == pytest.approx(reduced, rel=0.05)
    ln = layernorm_rows(4, 8, d, g, 0.02, 1e-5)
    assert ln.pow(2).sum(-1).mean().item() == pytest.approx(d * 8e-4 / (8e-4 + 1e-5), rel=0.02)  # ≈ d, not 1


def test_streaming_ridge_recovers_a_linear_map_chunk_by_chunk():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 4, generator=g, dtype=torch.float64)
    ridge = StreamingRidge(6, 4, 1e-9)
    for _ in range(5):
        x = torch.randn(100, 6, generator=g, dtype=torch.float64)
        ridge.update(x, x @ a)
    assert ridge.rows == 500 and (ridge.solve() - a).abs().max() < 1e-8


def test_basis_target_and_model_shapes_and_metrics():
    g = torch.Generator().manual_seed(0)
    target = BasisTarget.random(8, g)
    assert target.w1.shape == (32, 8) and target.w2.shape == (8, 32) and target.z.shape == (8, 8)
    x = torch.randn(100, 8, generator=g)
    y = target(x)
    expected = torch.nn.functional.gelu(x @ target.w1.T) @ target.w2.T + x @ target.z.T - x
    assert torch.allclose(y, expected)
    model = SkipGeluMLP(8)
    with torch.no_grad():
        model.down.weight.zero_()
    assert torch.equal(model(x), x)  # Eq. 11's skip
    assert relative_sq_error(y, y).item() == 0 and mean_cosine_distance(y, y).item() == pytest.approx(0, abs=1e-6)
    assert mean_cosine_distance(-y, y).item() == pytest.approx(2.0)
