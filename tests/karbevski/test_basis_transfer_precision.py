"""basis_transfer at dtype=float16 / bfloat16: mixed precision (float32 weights, autocast forward, the loss
reduced in float32, float16 loss-scaled), not parameters cast to float16, where the loss of a batch the
paper's size is inf. run.json records what ran."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from experiments.karbevski.basis_targets import BasisTarget, SkipGeluMLP, relative_sq_error
from experiments.karbevski.basis_transfer import run as bt
from tests.helpers.cli import run_cli

H, BATCH = 16, 4096  # 65 536 target entries, Σ‖Y‖² ≈ 1.3e5: beyond float16's 65 504, like 65 536 × 256


class _Log:
    def __init__(self):
        self.rows = []

    def log(self, metric, value, **index):
        self.rows.append((metric, value))


def _cfg(steps: int = 30):
    return OmegaConf.create({"mult": 4, "train": {"steps": steps, "batch": BATCH, "lr": 5e-3, "weight_decay": 0.1,
                                                  "clip": 3.0, "log_every": 5}})


def test_float16_parameters_alone_overflow_the_loss():
    """The control: what `dtype=float16` did before (everything cast to float16) gives an inf loss here."""
    gen = torch.Generator().manual_seed(0)
    target = BasisTarget.random(H, gen).to("cpu", torch.float16)
    model = SkipGeluMLP(H).to(torch.float16)
    x = torch.randn(BATCH, H, generator=gen).to(torch.float16)
    assert not torch.isfinite(relative_sq_error(model(x), target(x)))  # inf / inf


@pytest.mark.parametrize("amp", [torch.float16, torch.bfloat16])
def test_mixed_precision_training_keeps_float32_weights_and_a_finite_falling_loss(amp):
    gen = torch.Generator().manual_seed(0)
    target = BasisTarget.random(H, gen)
    log = _Log()
    model = bt.train(target, H, _cfg(), gen, torch.device("cpu"), torch.float32, log, amp)
    losses = [v for m, v in log.rows if m == "train_rel_sq_error"]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < 0.8 * losses[0], losses  # it learns
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_precision_names_what_ran():
    assert bt.precision(torch.float16) == "float16 autocast, float32 weights + loss scaling"
    assert bt.precision(torch.bfloat16) == "bfloat16 autocast, float32 weights"
    assert bt.precision(torch.float64) == "float64"


def test_a_float16_run_through_the_cli_records_its_precision_and_finite_errors(tmp_path):
    proc = run_cli("run", "basis_transfer", "preset=smoke", "dtype=float16", "widths=[8]", "train.steps=50",
                   f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["dtype"] == "float16" and record["precision"] == "float16 autocast, float32 weights + loss scaling"
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    rel = m[m.metric == "rel_l2"].set_index("model")["value"]
    assert rel.notna().all() and rel["mlp"] < rel["mlp_init"], rel
