"""Training reads only the query token's output, so it runs the context as keys/values and the query
alone: the same loss and gradients as the whole causal pass (float64, to rounding level)."""

from __future__ import annotations

import torch

from experiments.data.linreg import sample_prompts
from experiments.dherin.models.linreg import attention_block, predict, predict_query
from experiments.dherin.training import regression_loss


def _loss_and_grads(model, tokens, targets, forward):
    model.zero_grad()
    loss = regression_loss(forward(model, tokens), targets)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_query_only_forward_equals_the_whole_pass():
    torch.manual_seed(0)
    model = attention_block(2, mlp_skip=False).double()
    batch = sample_prompts(16, 30, 2, torch.Generator().manual_seed(1)).to(dtype=torch.float64)
    whole = _loss_and_grads(model, batch.tokens, batch.targets, lambda m, t: predict(m(t)))
    query = _loss_and_grads(model, batch.tokens, batch.targets, predict_query)
    assert torch.allclose(whole[0], query[0], rtol=1e-12, atol=0)
    for a, b in zip(whole[1], query[1], strict=True):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)


def test_a_query_that_misses_its_own_token_would_be_caught():
    """The comparison above can fail: attending to the context alone (without the query's own key) differs."""
    torch.manual_seed(0)
    model = attention_block(2).double()
    batch = sample_prompts(16, 30, 2, torch.Generator().manual_seed(1)).to(dtype=torch.float64)

    def context_only(m, t):
        k, v = m.contextual.cache(t[:, :-1])
        q = m.contextual.attn._heads(m.contextual.attn.q(t[:, -1:]))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0 / m.contextual.attn.d_k ** 0.5)
        a = t[:, -1:] + m.contextual.attn.out(y.transpose(1, 2).reshape(len(t), 1, -1))
        return predict(m.head(a))

    whole = _loss_and_grads(model, batch.tokens, batch.targets, lambda m, t: predict(m(t)))
    wrong = _loss_and_grads(model, batch.tokens, batch.targets, context_only)
    assert not torch.allclose(whole[0], wrong[0], rtol=1e-9, atol=0)
