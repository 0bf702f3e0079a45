"""Theorem 2.2 / Corollary 2.5.1 / Theorem B.2 on random tensors, in float64, in isolation."""

import pytest
import torch

from experiments.data.linreg import sample_prompts
from experiments.dherin.models.linreg import MLP, attention_block, predict
from experiments.dherin.patched_forward import forward_with, patched_params, predictions_three_ways
from experiments.patching.rank1 import context_patch, context_patch_skip, context_vector, rank1_update

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

F64 = torch.float64  # exactness is the point here; every tensor says so (no global default dtype)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


def randn(*shape, generator):
    return torch.randn(*shape, generator=generator, dtype=F64)


def random_mlp(n=5, m=17, seed=0):
    torch.manual_seed(seed)
    return MLP(n, m, n).double()


def test_patch_moves_the_context_into_W(rng):
    """φ_{W+ΔW}(A(C∖Y,x)) = φ_W(A(C,x)) for random activations: the identity, not the model."""
    mlp = random_mlp()
    a_full, a_red = randn(32, 5, generator=rng), randn(32, 5, generator=rng)
    W = mlp.w1.weight
    dW = context_patch(W, a_full, a_red)
    expected = mlp(a_full)
    patched = torch.stack([
        torch.func.functional_call(mlp, {"w1.weight": W + dW[i]}, (a_red[i],)) for i in range(32)
    ])
    torch.testing.assert_close(patched, expected, rtol=0, atol=1e-12)
    # the control: without the patch the outputs differ by O(1)
    assert (mlp(a_red) - expected).abs().max() > 1e-2


def test_patch_is_rank_one_and_matches_the_formula(rng):
    W = randn(11, 4, generator=rng)
    a_full, a_red = randn(4, generator=rng), randn(4, generator=rng)
    dW = context_patch(W, a_full, a_red)
    assert torch.linalg.matrix_rank(dW).item() == 1
    delta = a_full - a_red
    torch.testing.assert_close(dW, torch.outer(W @ delta, a_red) / a_red.dot(a_red), rtol=0, atol=1e-14)
    # ΔW A(C∖Y,x) = W δA: the one fact the proof uses
    torch.testing.assert_close(dW @ a_red, W @ delta, rtol=0, atol=1e-12)


def test_skip_form_adds_delta_A_to_the_last_bias(rng):
    """Theorem B.2: A + W′g(WA + b) + b′ with ΔW and Δb′ = δA."""
    mlp = random_mlp()
    a_full, a_red = randn(8, 5, generator=rng), randn(8, 5, generator=rng)
    dW, db = context_patch_skip(mlp.w1.weight, a_full, a_red)
    torch.testing.assert_close(db, context_vector(a_full, a_red))
    for i in range(8):
        params = {"w1.weight": mlp.w1.weight + dW[i], "w2.bias": mlp.w2.bias + db[i]}
        out = a_red[i] + torch.func.functional_call(mlp, params, (a_red[i],))
        torch.testing.assert_close(out, a_full[i] + mlp(a_full[i]), rtol=0, atol=1e-12)
    # the W patch alone is not enough once there is a skip connection
    alone = a_red[0] + torch.func.functional_call(mlp, {"w1.weight": mlp.w1.weight + dW[0]}, (a_red[0],))
    assert (alone - (a_full[0] + mlp(a_full[0]))).abs().max() > 1e-3


def test_zero_activation_is_refused():
    with pytest.raises(ValueError, match="undefined"):
        rank1_update(torch.ones(3, 2), torch.ones(2), torch.zeros(2))


@pytest.mark.parametrize("mlp_skip", [False, True])
def test_whole_block_with_and_without_context(rng, mlp_skip):
    """On the §4.1.1 block (random weights): the patched model without context reproduces the full
    output vector of the query token, through the model's own forward (vmap over tasks)."""
    torch.manual_seed(1)
    model = attention_block(2, mlp_skip=mlp_skip).double()
    batch = sample_prompts(16, 30, 2, rng, torch.float64)
    full = model(batch.tokens)[:, -1]
    patched = forward_with(model, patched_params(model, batch.tokens), batch.query)[:, -1]
    torch.testing.assert_close(patched, full, rtol=0, atol=1e-12)
    preds = predictions_three_ways(model, batch.tokens)
    torch.testing.assert_close(preds["patched"], predict(model(batch.tokens)), rtol=0, atol=1e-12)
    assert (preds["no_context"] - preds["context"]).abs().mean() > 1e-3


def test_removing_only_part_of_the_context(rng):
    """Theorem 2.2 with Y = the first k tokens: Φ_W(C, x) = Φ_{W+ΔW(Y)}(C∖Y, x)."""
    torch.manual_seed(2)
    model = attention_block(2).double()
    batch = sample_prompts(8, 20, 2, rng, torch.float64)
    k = 7
    params = patched_params(model, batch.tokens, n_removed=k)
    out = forward_with(model, params, batch.tokens[:, k:])[:, -1]
    torch.testing.assert_close(out, model(batch.tokens)[:, -1], rtol=0, atol=1e-12)


def test_many_queries_against_one_cached_context(rng):
    """The KV-cached path (used on Fig. 2's grid) gives the full-prompt numbers, all three ways."""
    from experiments.data.linreg import make_prompts

    torch.manual_seed(3)
    model = attention_block(2).double()
    one = sample_prompts(1, 25, 2, rng, torch.float64)
    xq = randn(40, 2, generator=rng)
    prompts = make_prompts(one.weights.expand(40, 2), one.tokens[:, :-1, :2].expand(40, 25, 2), xq)
    full = predictions_three_ways(model, prompts.tokens)
    cached = predictions_three_ways(model, prompts.tokens[:, -1:], cache=model.contextual.cache(prompts.context[:1]))
    for way in full:
        torch.testing.assert_close(cached[way], full[way], rtol=0, atol=1e-13)
    torch.testing.assert_close(full["context"], predict(model(prompts.tokens)), rtol=0, atol=0)
