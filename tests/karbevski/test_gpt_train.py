"""Training pieces of gpt_wq in isolation: the lr schedule, Ctrl-C leaving the last checkpoint intact,
the export to stock transformers GPT-2 (with a control), and the paper's comparisons able to fail."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from experiments.karbevski.gpt import checkpoint as ckpt
from experiments.karbevski.gpt.comparisons import PAPER_LOSS, paper_comparisons
from experiments.karbevski.gpt.export import to_gpt2
from experiments.karbevski.gpt.model import GPT, GPTConfig
from experiments.karbevski.gpt.train import LoopState, TrainSettings, lr_at, make_optimizer, train

TINY = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, d_model=16, mlp_hidden=64)
S = TrainSettings(steps=6, micro_batch=2, grad_accum=1, lr=1e-3, min_lr=1e-4, warmup_steps=2, decay_steps=6,
                  weight_decay=0.1, eval_every=3, eval_batch=4, log_every=1, checkpoint_every=2)


def test_lr_schedule_papers_horizon():
    paper = replace(S, lr=6e-4, min_lr=6e-5, warmup_steps=2000, decay_steps=600_000, steps=100_000)
    assert lr_at(0, paper) < 1e-6 and lr_at(2000, paper) == pytest.approx(6e-4)
    # the authors stop at 100k of a 600k cosine: the lr there is still ~94 % of peak
    assert lr_at(100_000, paper) / 6e-4 == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 98 / 598)))
    assert 0.93 < lr_at(100_000, paper) / 6e-4 < 0.95
    assert lr_at(600_000, paper) == pytest.approx(6e-5) and lr_at(700_000, paper) == pytest.approx(6e-5)


def _setup(tmp_path):
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, S, torch.device("cpu"))
    data = np.random.default_rng(0).integers(0, TINY.vocab_size, 500).astype(np.uint16)
    starts = np.arange(0, 64, 8)
    identity = ckpt.describe("baseline_124m", TINY, "bytes", "fixture")
    return model, opt, data, starts, identity


def test_ctrl_c_keeps_the_last_checkpoint(tmp_path):
    model, opt, data, starts, identity = _setup(tmp_path)
    state = LoopState(0, [])

    def log(metric, value, step):
        state.curve.append((metric, value, step))
        if metric == "train_loss" and step == 5:
            raise KeyboardInterrupt  # Ctrl-C in the middle of step 5's bookkeeping

    def save(step):
        ckpt.save(tmp_path, identity, step, model, opt, state.curve)

    with pytest.raises(KeyboardInterrupt, match="interrupted at step 5"):
        train(model, opt, S, data, data, starts, TINY.block_size, torch.device("cpu"), state, log, save)
    saved = ckpt.load(str(tmp_path), identity, map_location="cpu")
    assert saved["step"] == 4  # the step-4 checkpoint, whole and loadable
    assert ckpt.check_compatible(str(tmp_path), identity)["step"] == 4
    with pytest.raises(Exception, match="another variant"):
        ckpt.check_compatible(str(tmp_path), {**identity, "variant": "wq_identity_117m"})


@pytest.mark.parametrize("query,mult", [("learned", 1.0), ("identity", 0.5)])
def test_export_gives_the_same_logits_and_a_changed_weight_does_not(query, mult):
    torch.manual_seed(3)
    model = GPT(replace(TINY, query=query, attn_scale_mult=mult)).double().eval()
    with torch.no_grad():  # non-trivial LayerNorm scales so a transposition or scale slip shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    hf = to_gpt2(model).double()
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.block_size))
    ours = model(idx)[0]
    with torch.no_grad():
        theirs = hf(idx).logits
        assert (ours - theirs).abs().max().item() < 1e-10
        # control: GPT-2's default attention scale without the folded multiplier (or a changed W_Q)
        hf.transformer.h[0].attn.c_attn.weight[:, : TINY.d_model] *= 2.0
        assert (ours - hf(idx).logits).abs().max().item() > 1e-4


def test_paper_comparisons_pass_on_the_papers_numbers_and_fail_when_reversed():
    rows = {r["id"]: r for r in paper_comparisons(PAPER_LOSS)}
    assert len(rows) == 4
    assert rows["karbevski.table2.large_mlp_best"]["measured"] == pytest.approx(0.012)
    reversed_losses = {**PAPER_LOSS, "wq_identity_117m": 3.05, "wq_identity_large_mlp": 3.06}
    for r in paper_comparisons(reversed_losses):
        passed = r["measured"] <= r["tolerance"] if r["comparison"] == "<=" else r["measured"] >= r["tolerance"]
        assert not passed, r["id"]
    assert paper_comparisons({"baseline_124m": 3.0}) == []  # nothing to compare in a one-variant job
