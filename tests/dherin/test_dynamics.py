"""The implicit dynamics of Dherin et al. §3 (Prop. 3.1) and App. E (Eqs. 27–31) on random models, float64."""

import pytest
import torch
from torch import nn

from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import (
    factor_matrices,
    factor_products,
    factorized_weights,
    increment_norms,
    prefix_contextual_outputs,
    prefix_patches,
    prop31_deltas,
    prop31_step,
    suffix_contextual_outputs,
    trace_loss,
)
from experiments.dherin.models.linreg import MLP, ContextualBlock, attention_block
from experiments.dherin.patched_forward import W_NAME, forward_with

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

B, N, D = 5, 7, 2


class TinyRNN(nn.Module):
    """A causal contextual layer that is not attention: h_t = tanh(U x_t + V h_{t−1}), back to token width.

    Written as a loop rather than nn.RNN because the patched forward (`forward_with`) runs under
    vmap, which has no batching rule for the fused RNN kernel.
    """

    def __init__(self, d_in: int, hidden: int = 6):
        super().__init__()
        self.inp, self.out = nn.Linear(d_in, hidden), nn.Linear(hidden, d_in)
        self.rec = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        h, states = torch.zeros(x.shape[0], self.rec.in_features, dtype=x.dtype), []
        for t in range(x.shape[1]):
            h = torch.tanh(self.inp(x[:, t]) + self.rec(h))
            states.append(h)
        return self.out(torch.stack(states, dim=1))


def attention_model():
    torch.manual_seed(0)
    return attention_block(D, d_model=8, n_heads=2, d_mlp=16).double()


def rnn_model():
    torch.manual_seed(1)
    return ContextualBlock(TinyRNN(D + 1), MLP(D + 1, 16, D + 1)).double()


MODELS = {"attention": attention_model, "rnn": rnn_model}


@pytest.fixture
def tokens():
    return sample_prompts(B, N, D, torch.Generator().manual_seed(0), dtype=torch.float64).tokens


def prompt(tokens, kept):
    """The prompt made of context positions `kept` followed by the query."""
    return torch.cat([tokens[:, kept], tokens[:, -1:]], dim=1)


@pytest.mark.parametrize("name", MODELS)
def test_prefix_outputs_are_those_of_the_prefix_prompts(name, tokens):
    model = MODELS[name]()
    a = prefix_contextual_outputs(model.contextual, tokens)
    assert a.shape == (B, N + 1, D + 1)
    for i in range(N + 1):
        expected = model.contextual(prompt(tokens, list(range(i))))[:, -1]
        torch.testing.assert_close(a[:, i], expected, rtol=0, atol=1e-14)
    # control: the causal output at position i is a different thing (c_{i} sits where x should be)
    assert (model.contextual(tokens)[:, 1:N + 1] - a[:, 1:]).abs().max() > 1e-3


@pytest.mark.parametrize("name", MODELS)
def test_suffix_outputs_are_those_of_the_suffix_prompts(name, tokens):
    model = MODELS[name]()
    s = suffix_contextual_outputs(model.contextual, tokens)
    for i in range(N + 1):
        torch.testing.assert_close(s[:, i], model.contextual(prompt(tokens, list(range(i, N))))[:, -1],
                                   rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", MODELS)
def test_prefix_patch_moves_each_prefix_into_W(name, tokens):
    """Φ_{W+(ΔW)_i}(x) = Φ_W(C_i, x) for every i, by a genuine forward pass of the patched weights."""
    model = MODELS[name]()
    patches = prefix_patches(model, tokens)
    assert patches.shape == (B, N, 16, D + 1)
    W, query = model.mlp.w1.weight, tokens[:, -1:]
    for i in range(1, N + 1):
        with torch.no_grad():
            want = model(prompt(tokens, list(range(i))))[:, -1]
            got = forward_with(model, {W_NAME: W + patches[:, i - 1]}, query)[:, -1]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            assert torch.linalg.matrix_rank(patches[0, i - 1]).item() == 1
            # control: the unpatched model without the context
            assert (model(query)[:, -1] - want).abs().max() > 1e-4


def test_increment_norms_match_the_singular_values():
    g = torch.Generator().manual_seed(2)
    patches = torch.randn(3, 6, 5, 4, generator=g, dtype=torch.float64)
    norms = increment_norms(patches)
    assert norms["op2"].shape == norms["fro"].shape == (3, 5)
    for b in range(3):
        for i in range(5):
            step = patches[b, i + 1] - patches[b, i]
            s = torch.linalg.svdvals(step)
            assert norms["op2"][b, i].item() == pytest.approx(s[0].item(), rel=1e-12)
            assert norms["fro"][b, i].item() == pytest.approx(s.pow(2).sum().sqrt().item(), rel=1e-12)
    assert (norms["op2"] < norms["fro"]).all()  # generic steps are not rank-1


def test_prefix_increments_are_rank_one(tokens):
    """§3's steps share the right factor A(x)ᵀ, so their 2-norm and Frobenius norm coincide."""
    norms = increment_norms(prefix_patches(attention_model(), tokens))
    torch.testing.assert_close(norms["op2"], norms["fro"], rtol=1e-10, atol=0)


def test_trace_loss_gradient_is_delta():
    g = torch.Generator().manual_seed(3)
    W, delta = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    W.requires_grad_(True)
    (gW,) = torch.autograd.grad(trace_loss(W, delta), W)
    torch.testing.assert_close(gW, delta, rtol=0, atol=0)


@pytest.mark.parametrize("name", MODELS)
def test_prop31_steps_are_gradient_steps(name, tokens):
    """W_{i+1} = W_i − h ∇_W trace(Δ_iᵀ W), h = 1/‖A(x)‖², for i = 0..n−1 (W_0 the trained weights)."""
    model = MODELS[name]()
    W0 = model.mlp.w1.weight.detach()
    a = prefix_contextual_outputs(model.contextual, tokens)
    weights = torch.cat([W0.expand(B, 1, *W0.shape), W0 + prefix_patches(model, tokens)], dim=1)  # W_0..W_n
    predicted = prop31_step(weights[:, :-1], prop31_deltas(W0, a), a[:, :1].expand(B, N, D + 1))
    torch.testing.assert_close(predicted, weights[:, 1:], rtol=0, atol=1e-12)
    # control: standing still (W_{i+1} ≈ W_i) is wrong by the size of the step
    assert (weights[:, 1:] - weights[:, :-1]).abs().max() > 1e-3
    # and the wrong learning rate (h = 1) misses
    wrong = prop31_step(weights[:, :-1], prop31_deltas(W0, a), torch.ones(B, N, 1, dtype=torch.float64))
    assert (wrong - weights[:, 1:]).abs().max() > 1e-3


@pytest.mark.parametrize("name", MODELS)
def test_factorized_dynamics_keeps_the_output(name, tokens):
    """Eq. 28: Φ_{W_i}(c_{i+1}..c_n, x) = Φ_{W_0}(c_1..c_n, x) for every i (genuine forward passes)."""
    model = MODELS[name]()
    W0 = model.mlp.w1.weight.detach()
    s = suffix_contextual_outputs(model.contextual, tokens)
    weights = factorized_weights(W0, s)
    assert weights.shape == (B, N + 1, 16, D + 1)
    torch.testing.assert_close(weights[:, 0], W0.expand(B, *W0.shape), rtol=0, atol=0)
    with torch.no_grad():
        full = model(tokens)[:, -1]
        for i in range(N + 1):
            rest = tokens[:, i:]
            got = forward_with(model, {W_NAME: weights[:, i]}, rest)[:, -1]
            torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
            if 0 < i:  # control: the unpatched model on the remaining tokens
                assert (model(rest)[:, -1] - full).abs().max() > 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_product_form_equals_the_recursion(name, tokens):
    """Eqs. 29–31: W_i = W_0 (I + h_1 A_1) ⋯ (I + h_i A_i), in particular W_n."""
    model = MODELS[name]()
    W0 = model.mlp.w1.weight.detach()
    s = suffix_contextual_outputs(model.contextual, tokens)
    factors = factor_matrices(s)
    assert factors.shape == (B, N, D + 1, D + 1)
    products = factor_products(W0, factors)
    weights = factorized_weights(W0, s)
    torch.testing.assert_close(products, weights, rtol=0, atol=1e-12)
    # W_n acts on A(x) as W_0 does on A(C, x) ...
    torch.testing.assert_close(weights[:, -1] @ s[:, -1, :, None], W0 @ s[:, 0, :, None], rtol=0, atol=1e-12)
    # ... and the order of the factors matters (control: the product in reverse order)
    reverse = factor_products(W0, factors.flip(1))[:, -1]
    assert (reverse - weights[:, -1]).abs().max() > 1e-6


def test_zero_query_output_is_refused():
    model = attention_model()
    tokens = torch.zeros(1, 3, D + 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="undefined"):
        prefix_patches(model, tokens)
