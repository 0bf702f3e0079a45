"""App. C (Theorem B.2 applied block by block) on random post-LN stacks, in float64."""

import pytest
import torch

from experiments.data.linreg import sample_prompts
from experiments.dherin.models.linreg import predict
from experiments.dherin.models.post_ln_stack import PostLNBlock, PostLNStack
from experiments.dherin.patched_forward import forward_with
from experiments.dherin.stack_patch import (
    block_params,
    patched_block_outputs,
    patched_stack_params,
    query_block_outputs_three_ways,
    reduced_prompt,
    stack_patches,
    stack_predictions_three_ways,
)
from experiments.patching.rank1 import context_patch_skip

ATOL = 1e-12  # float64: "equal" means rounding level


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


def random_stack(n_layers=4, seed=0, d=2, d_model=16, n_heads=4, d_mlp=24):
    torch.manual_seed(seed)
    model = PostLNStack(d, n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_mlp=d_mlp).double().eval()
    with torch.no_grad():  # LayerNorm starts as the identity affine map; make it a generic one
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(0.3 * torch.randn_like(module.weight))
                module.bias.add_(0.3 * torch.randn_like(module.bias))
    return model


def test_block_is_contextual_block_inside_a_layernorm(rng):
    """Φ(x) = LayerNorm(A + φ(A)), A = LayerNorm(x + MHA(x)), spelled out against the module."""
    torch.manual_seed(0)
    block = PostLNBlock(16, 4, 24).double()
    x = torch.randn(3, 7, 16, generator=rng, dtype=torch.float64)
    mha, ln1 = block.contextual[0].attn, block.contextual[1]
    y = ln1(x + mha(x))
    mlp = block.mlp.w2(torch.relu(block.mlp.w1(y)))
    torch.testing.assert_close(block(x), block.norm(y + mlp), rtol=0, atol=ATOL)


def test_theorem_b2_holds_through_the_final_layernorm(rng):
    """One block, arbitrary full and reduced inputs: ΔW₁ and Δb₂ = δA reproduce the query's output."""
    torch.manual_seed(1)
    block = PostLNBlock(16, 4, 24).double()
    h_full = torch.randn(5, 9, 16, generator=rng, dtype=torch.float64)
    h_reduced = torch.randn(5, 3, 16, generator=rng, dtype=torch.float64)
    dW, db = context_patch_skip(block.mlp.w1.weight, block.contextual(h_full)[:, -1],
                                block.contextual(h_reduced)[:, -1])
    patched = forward_with(block, block_params(block, dW, db), h_reduced)[:, -1]
    torch.testing.assert_close(patched, block(h_full)[:, -1], rtol=0, atol=ATOL)
    # control: the unpatched block on the reduced input
    assert (block(h_reduced)[:, -1] - block(h_full)[:, -1]).norm(dim=-1).min() > 1e-2


@pytest.mark.parametrize("n_removed", [None, 1, 7, 20])
def test_every_block_output_at_the_query_is_reproduced(rng, n_removed):
    """Eq. 22 block by block: Φ⁽ⁱ⁾_{W,b}(C, x) = Φ⁽ⁱ⁾_{W+ΔW,b+Δb}(C∖Y, x) for i = 1..L, Y = the first k
    examples (None: all of C; 20 = N also removes all of C, through the other code path)."""
    model = random_stack()
    batch = sample_prompts(6, 20, 2, rng, torch.float64)
    out = query_block_outputs_three_ways(model, batch.tokens, n_removed)
    assert out["context"].shape == (6, 4, 16)
    torch.testing.assert_close(out["patched"], out["context"], rtol=0, atol=ATOL)
    assert (out["no_context"] - out["context"]).norm(dim=-1).min() > 1e-3  # the control differs at every block
    preds = stack_predictions_three_ways(model, batch.tokens, n_removed)
    torch.testing.assert_close(preds["patched"], predict(model(batch.tokens)), rtol=0, atol=ATOL)
    assert (preds["no_context"] - preds["context"]).abs().mean() > 1e-3


def test_removing_all_examples_equals_the_query_alone(rng):
    model = random_stack()
    batch = sample_prompts(4, 10, 2, rng, torch.float64)
    a = stack_patches(model, batch.tokens, None)
    b = stack_patches(model, batch.tokens, 10)
    for (dw_a, db_a), (dw_b, db_b) in zip(a, b, strict=True):
        torch.testing.assert_close(dw_a, dw_b, rtol=0, atol=0)
        torch.testing.assert_close(db_a, db_b, rtol=0, atol=0)


def test_patches_are_rank_one_and_delta_b_is_the_context_vector(rng):
    model = random_stack()
    batch = sample_prompts(3, 12, 2, rng, torch.float64)
    patches = stack_patches(model, batch.tokens)
    assert len(patches) == 4
    # block 1's reduced input is the query alone, unpatched
    block = model.blocks[0]
    delta_a = block.contextual(model.read_in(batch.tokens))[:, -1] - block.contextual(model.read_in(batch.query))[:, -1]
    torch.testing.assert_close(patches[0][1], delta_a, rtol=0, atol=ATOL)
    for dW, _ in patches:
        assert dW.shape == (3, 24, 16)
        assert (torch.linalg.matrix_rank(dW) == 1).all()


def test_the_order_first_to_last_matters(rng):
    """Patches computed from the *unpatched* reduced pass (each layer on its own) reproduce block 1 only:
    layer i must see the patched output of layer i−1 (App. C's iteration), else the error propagates."""
    model = random_stack()
    batch = sample_prompts(6, 20, 2, rng, torch.float64)
    full = model(batch.tokens, return_blocks=True)[:, :, -1]
    reduced = model(batch.query, return_blocks=True)  # unpatched blocks' outputs on x alone
    h_full = [model.read_in(batch.tokens)] + list(model(batch.tokens, return_blocks=True).unbind(1))
    h_red = [model.read_in(batch.query)] + list(reduced.unbind(1))
    naive = [context_patch_skip(b.mlp.w1.weight, b.contextual(h_full[i])[:, -1], b.contextual(h_red[i])[:, -1])
             for i, b in enumerate(model.blocks)]
    out = patched_block_outputs(model, patched_stack_params(model, naive), batch.query)[:, :, -1]
    err = (out - full).norm(dim=-1).max(0).values  # per block
    assert err[0] < ATOL and (err[1:] > 1e-3).all()


def test_partial_removal_keeps_the_rest_of_the_context_in_play(rng):
    """With Y = the first k examples the patched stack still reads c_{k+1..N}: changing one of them
    changes its output (so the match is not the query-alone patch in disguise)."""
    model = random_stack()
    batch = sample_prompts(2, 12, 2, rng, torch.float64)
    k = 5
    params = patched_stack_params(model, stack_patches(model, batch.tokens, k))
    reduced = reduced_prompt(batch.tokens, k)
    altered = reduced.clone()
    altered[:, 2] += 1.0
    a = predict(forward_with(model, params, reduced))
    b = predict(forward_with(model, params, altered))
    assert (a - b).abs().min() > 1e-6
