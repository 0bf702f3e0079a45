"""The W_Q = I constructions of §3-4 alone, in float64: each exact to rounding, each control far off,
and the obstructions the paper states visibly non-zero."""

from __future__ import annotations

import pytest
import torch

from experiments.core.errors import UserError
from experiments.karbevski import reparam as rp
from experiments.karbevski.toy_transformer import Arch, attention_core, forward, parameter_counts, random_weights

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

D, HEADS, LAYERS, VOCAB, N = 12, 3, 3, 20, 7
EXACT, FAR = 1e-11, 1e-3


def rel(a, b):
    return ((a - b).abs().max() / a.abs().max()).item()


@pytest.fixture
def g():
    return torch.Generator().manual_seed(0)


def square(g, d=D):
    return torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5


@pytest.fixture
def tokens(g):
    return torch.randint(0, VOCAB, (2, N), generator=g)


def model(g, **kw):
    return random_weights(VOCAB, D, 4 * D, LAYERS, N, g, **kw)


def test_lemma31_invariance_and_its_control(g):
    x, wq, wk, wv, theta = torch.randn(2, N, D, generator=g, dtype=torch.float64), *(square(g) for _ in range(4))
    original = attention_core(x, wq, wk, wv, HEADS)
    assert rel(original, attention_core(*rp.lemma31_transform(x, wq, wk, wv, theta), HEADS)) < EXACT
    assert rel(original, attention_core(x @ theta, wq, wk, wv, HEADS)) > FAR
    xr, q, k, v = rp.lemma31_reduce(x, wq, wk, wv)
    assert q is None and rel(original, attention_core(xr, q, k, v, HEADS)) < EXACT
    assert rel(original, attention_core(xr, None, wk, wv, HEADS)) > FAR


def test_prop41_single_head_only(g):
    x, wq, wk, wv, wo = torch.randn(2, N, D, generator=g, dtype=torch.float64), *(square(g) for _ in range(4))
    q, k, v, o = rp.prop41_merge(wq, wk, wv, wo)
    assert rel(attention_core(x, wq, wk, wv, 1) @ wo, attention_core(x, q, k, v, 1) @ o) < EXACT
    assert rel(attention_core(x, wq, wk, wv, HEADS) @ wo, attention_core(x, q, k, v, HEADS) @ o) > FAR


def test_prop42_block_diagonal_yes_dense_no(g):
    x, wq, wk, wv = torch.randn(2, N, D, generator=g, dtype=torch.float64), *(square(g) for _ in range(3))
    blocks = rp.block_diagonal([square(g, D // HEADS) for _ in range(HEADS)])
    original = attention_core(x, wq, wk, wv, HEADS)
    assert rel(original, attention_core(x, *rp.prop42_absorb(wq, wk, blocks), wv, HEADS)) < EXACT
    assert rel(original, attention_core(x, *rp.prop42_absorb(wq, wk, square(g)), wv, HEADS)) > FAR


@pytest.mark.parametrize("tied", [False, True])
def test_thm41_every_layer(g, tokens, tied):
    w, arch = model(g, tied=tied), Arch(heads=HEADS)
    original = forward(tokens, w, arch)
    for j in range(LAYERS):
        reduced = rp.thm41_single_layer(w, j)
        assert reduced["layers"][j]["W_Q"] is None and reduced["head"] is not None  # untied (Remark 4)
        assert rel(original, forward(tokens, reduced, arch)) < EXACT
        assert rel(original, forward(tokens, rp.drop_queries(w, [j]), arch)) > FAR


def test_remark4_tied_head_must_be_untied(g, tokens):
    w, arch = model(g, tied=True), Arch(heads=HEADS)
    assert rel(forward(tokens, w, arch), forward(tokens, rp.thm41_single_layer(w, 0, keep_tied=True), arch)) > FAR


@pytest.mark.parametrize("tied", [False, True])
def test_thm42_all_layers_attention_skip_only(g, tokens, tied):
    w, arch = model(g, tied=tied), Arch(heads=HEADS, skips="attention")
    reduced = rp.thm42_attention_skip_only(w)
    assert all(layer["W_Q"] is None for layer in reduced["layers"])
    assert (reduced["head"] is None) == tied  # tied stays tied (Θ_{L+1} = Θ_1⁻ᵀ)
    original = forward(tokens, w, arch)
    assert rel(original, forward(tokens, reduced, arch)) < EXACT
    assert rel(original, forward(tokens, rp.drop_queries(w), arch)) > FAR


def test_remark1_all_layers_with_both_skips_fails(g, tokens):
    w, both = model(g), Arch(heads=HEADS)
    assert rel(forward(tokens, w, both), forward(tokens, rp.thm42_attention_skip_only(w), both)) > FAR


def test_thm43_shared_yes_unshared_no(g, tokens):
    arch = Arch(heads=HEADS)
    shared, separate = model(g, shared=True), model(g)
    reduced = rp.thm43_shared(shared)
    assert len({id(layer) for layer in reduced["layers"]}) == 1  # still one shared block
    assert rel(forward(tokens, shared, arch), forward(tokens, reduced, arch)) < EXACT
    assert rel(forward(tokens, separate, arch), forward(tokens, rp.thm43_shared(separate), arch)) > FAR


def test_layernorm_breaks_the_linear_basis_change(g, tokens):
    w, ln = model(g), Arch(heads=HEADS, norm="layernorm")
    assert rel(forward(tokens, w, ln), forward(tokens, rp.thm41_single_layer(w, 0), ln)) > FAR


def test_reduced_model_has_a_quarter_fewer_attention_parameters(g):
    w = model(g)
    before, after = parameter_counts(w), parameter_counts(rp.thm42_attention_skip_only(w))
    assert after["attention"] == 3 * LAYERS * D * D == 0.75 * before["attention"]
    assert after["mlp"] == before["mlp"]


def test_singular_query_weight_is_refused_naming_gl(g, tokens):
    w = model(g)
    w["layers"][1]["W_Q"] = square(g)[:, :4] @ square(g)[:4, :]  # rank 4 < 12
    with pytest.raises(UserError, match=r"GL\(d\).*rank 4 < d = 12"):
        rp.thm41_single_layer(w, 1)
    with pytest.raises(UserError, match="GL"):
        rp.thm42_attention_skip_only(w)
    with pytest.raises(UserError, match="GL"):
        singular = torch.zeros(D, D, dtype=torch.float64)
        rp.lemma31_transform(torch.zeros(1, 2, D), square(g), square(g), square(g), singular)
