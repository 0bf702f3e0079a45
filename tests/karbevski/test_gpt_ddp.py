"""DDP on CPU: torchrun with the gloo backend and 2 processes, through the real CLI. Two ranks with one
micro-batch each must take the same optimizer steps as one process accumulating two (batches depend on
the global micro-batch index), and only rank 0 writes into the one shared run folder."""

from __future__ import annotations

import json

import pandas as pd

from tests.helpers.cli import run_cli

# the session's shared gpt_wq smoke run (tests/helpers/smoke_runs.py) is the one process: preset=smoke accumulates two
# micro-batches a step, and its lr horizon is fixed (decay_steps=6); the ranks read its data cache
ARGS = ("preset=smoke", "train.decay_steps=6", "export_hf=false", "train.grad_accum=2")


def curve(run_dir, metric):
    m = pd.read_csv(run_dir / "metrics.csv")
    return m[m["metric"] == metric].set_index("step")["value"]


def test_two_gloo_ranks_match_one_process_and_only_rank0_writes(tmp_path, smoke_runs):
    single = smoke_runs("gpt_wq")
    cache = f"cache_dir={smoke_runs.root / 'gpt_wq_cache'}"
    ddp = run_cli("run", "gpt_wq", *ARGS, cache, f"hydra.run.dir={tmp_path / 'ddp'}", env={"OMP_NUM_THREADS": "1"},
                  launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    run_dir = tmp_path / "ddp"
    assert "train.decay_steps=6" in json.loads((single / "run.json").read_text())["overrides"]
    assert curve(single, "world_size").iloc[0] == 1
    assert (curve(run_dir, "train_loss") - curve(single, "train_loss")).abs().max() < 1e-5
    assert (curve(run_dir, "val_loss") - curve(single, "val_loss")).abs().max() < 1e-5
    assert curve(run_dir, "world_size").iloc[0] == 2
    # one folder, written once: one run.json, one log whose lines are not doubled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp"]
    log = (run_dir / "icl-exp.log").read_text()
    assert log.count("gpt_wq: Table 2, Fig. 1 ->") == 1
    assert pd.read_csv(run_dir / "metrics.csv").duplicated().sum() == 0
