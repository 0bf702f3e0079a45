"""The GPT of Karbevski §5.1: Table 2's parameter counts, W_Q = I as a genuine forward pass, attention."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from experiments.karbevski.gpt.model import GPT, GPTConfig, param_groups
from experiments.karbevski.gpt.params import count_formula, count_meta
from experiments.karbevski.gpt.variants import VARIANTS, model_config, param_matched_width

TINY = GPTConfig(vocab_size=67, block_size=16, n_layer=2, n_head=4, d_model=32, mlp_hidden=128)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_table2_parameter_counts_at_paper_shape(name):
    variant = VARIANTS[name]
    cfg = model_config(variant, GPTConfig())
    meta = count_meta(cfg)
    assert meta == count_formula(cfg)
    # Table 2 rounds to 0.01M
    assert round(meta["total"] / 1e6, 2) == pytest.approx(variant.paper_total_m)
    assert round(meta["non_embedding"] / 1e6, 2) == pytest.approx(variant.paper_non_embedding_m)


def test_smaller_d_model_rule_gives_the_papers_744():
    assert param_matched_width(GPTConfig()) == 744
    assert model_config(VARIANTS["baseline_small_d"], GPTConfig()).head_dim == 62  # Table 2: 1/sqrt(62)


@pytest.mark.parametrize("query", ["learned", "identity"])
def test_formula_counts_an_allocated_model(query):
    model = GPT(replace(TINY, query=query))
    total = sum(p.numel() for p in model.parameters())
    assert count_formula(model.cfg)["total"] == total
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: the head is not counted twice


def _copy_shared(src: GPT, dst: GPT) -> None:
    """dst gets src's weights; dst's extra W_Q block (learned query) is set to the identity."""
    d = src.cfg.d_model
    with torch.no_grad():
        for (name, p_src), (_, p_dst) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
            if name.endswith("attn.c_attn.weight") and p_dst.shape[0] == 3 * d:
                p_dst[:d] = torch.eye(d, dtype=p_dst.dtype)
                p_dst[d:] = p_src
            else:
                p_dst.copy_(p_src)


def test_identity_query_equals_learned_query_set_to_identity():
    torch.manual_seed(0)
    reduced = GPT(replace(TINY, query="identity", attn_scale_mult=0.5)).double()
    full = GPT(replace(TINY, query="learned", attn_scale_mult=0.5)).double()
    _copy_shared(reduced, full)
    idx = torch.randint(0, TINY.vocab_size, (3, TINY.block_size))
    a, _ = reduced(idx)
    b, _ = full(idx)
    assert (a - b).abs().max().item() < 1e-12
    # control: a learned W_Q that is not the identity changes the function
    with torch.no_grad():
        full.transformer.h[0].attn.c_attn.weight[: TINY.d_model] += 0.3 * torch.randn(TINY.d_model, TINY.d_model,
                                                                                       dtype=torch.float64)
    c, _ = full(idx)
    assert (a - c).abs().max().item() > 1e-3


def _manual_attention(block, x, cfg):
    """Causal softmax attention written out (independent of scaled_dot_product_attention)."""
    B, T, C = x.shape
    w = block.attn.c_attn.weight
    if cfg.query == "learned":
        q, k, v = (x @ w.T).split(C, dim=2)
    else:
        k, v = (x @ w.T).split(C, dim=2)
        q = x
    h, dk = cfg.n_head, cfg.head_dim
    q, k, v = (t.view(B, T, h, dk).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * (cfg.attn_scale_mult / math.sqrt(dk))
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    return y @ block.attn.c_proj.weight.T


@pytest.mark.parametrize("query,mult", [("learned", 1.0), ("identity", 0.5)])
def test_attention_matches_written_out_softmax(query, mult):
    torch.manual_seed(1)
    cfg = replace(TINY, query=query, attn_scale_mult=mult)
    block = GPT(cfg).double().transformer.h[0]
    x = torch.randn(2, 10, cfg.d_model, dtype=torch.float64)
    assert (block.attn(x) - _manual_attention(block, x, cfg)).abs().max().item() < 1e-12
    # control: the other scale is measurably different
    wrong = _manual_attention(block, x, replace(cfg, attn_scale_mult=2 * mult))
    assert (block.attn(x) - wrong).abs().max().item() > 1e-4


def test_causal_and_loss_is_cross_entropy():
    torch.manual_seed(2)
    model = GPT(TINY)
    idx = torch.randint(0, TINY.vocab_size, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.allclose(a[0, :8], b[0, :8]) and not torch.allclose(a[0, 8:], b[0, 8:])
    _, loss = model(idx[:, :-1], idx[:, 1:])
    manual = -a[0, :-1].log_softmax(-1).gather(-1, idx[0, 1:, None]).mean()
    assert loss.item() == pytest.approx(manual.item(), rel=1e-5)
    # untrained: near log(vocab)
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.5


def test_weight_decay_only_on_matrices():
    model = GPT(TINY)
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(no_decay["params"]) == 2 * TINY.n_layer + 1  # ln_1, ln_2 per block, ln_f
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
