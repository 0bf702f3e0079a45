"""gpt_wq's precision follows `dtype` on every device (bf16 autocast only when dtype=bfloat16, also on
CUDA) and run.json records what ran; its tokens_per_s counts training steps only (not evaluation,
checkpoints or compilation). No GPU here: the CUDA branch is checked on the autocast it would enter."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from experiments.karbevski.gpt import train as train_mod
from experiments.karbevski.gpt.model import GPT, GPTConfig
from experiments.karbevski.gpt.train import LoopState, TrainSettings, autocast, make_optimizer, train
from tests.helpers.cli import run_cli

TINY = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, d_model=16, mlp_hidden=64)
S = TrainSettings(steps=4, micro_batch=2, grad_accum=1, lr=1e-3, min_lr=1e-4, warmup_steps=1, decay_steps=4,
                  weight_decay=0.1, eval_every=1, eval_batch=4, log_every=2, checkpoint_every=1)


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # torch says so when it builds the CUDA autocast here
def test_autocast_follows_the_dtype_on_cuda_too():
    cuda = torch.device("cuda")  # a device object needs no GPU
    assert isinstance(autocast(cuda, None), contextlib.nullcontext)  # dtype=float32: float32 on CUDA as well
    bf16 = autocast(cuda, torch.bfloat16)
    assert isinstance(bf16, torch.autocast) and bf16.fast_dtype == torch.bfloat16 and bf16.device == "cuda"
    cpu = autocast(torch.device("cpu"), torch.bfloat16)
    assert cpu.fast_dtype == torch.bfloat16 and cpu.device == "cpu"


def test_run_json_records_the_precision_that_ran(tmp_path, smoke_runs):
    record = json.loads((smoke_runs("gpt_wq") / "run.json").read_text())  # the shared run: dtype=float32
    assert record["dtype"] == "float32" and record["precision"] == "float32 (IEEE)"
    run_dir = tmp_path / "bf16"
    proc = run_cli("run", "gpt_wq", "preset=smoke", "export_hf=false", "dtype=bfloat16", "train.steps=2",
                   f"cache_dir={smoke_runs.root / 'gpt_wq_cache'}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["dtype"] == "bfloat16" and record["precision"] == "bfloat16 autocast, float32 weights"
    # dtype=float16 is refused in one line, before any folder (in this process: no second interpreter)
    from tests.helpers.cli import invoke_in_process

    refused = invoke_in_process("run", "gpt_wq", "preset=smoke", "dtype=float16", f"hydra.run.dir={tmp_path / 'fp16'}")
    assert refused.exit_code == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "dtype=float16" in refused.stderr and not (tmp_path / "fp16").exists()


class _JumpingClock:
    """time as train.py reads it, where evaluation and checkpoints take `slow_s` each without sleeping:
    the clock jumps ahead instead, so the test says the same on a loaded machine as on an idle one."""

    def __init__(self):
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def __getattr__(self, name):  # anything else train.py reads from `time`
        return getattr(time, name)


def _tiny_run(monkeypatch, s: TrainSettings, slow_s: float) -> list[tuple[str, float, int]]:
    """Train TINY with evaluation and checkpoints that each take `slow_s` (on train.py's clock); return
    the logged curve."""
    clock = _JumpingClock()

    def slow(*args, **kwargs):
        clock.offset += slow_s
        return 1.0

    monkeypatch.setattr(train_mod, "time", clock)
    monkeypatch.setattr(train_mod, "evaluate", slow)
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, s, torch.device("cpu"))
    data = np.random.default_rng(0).integers(0, TINY.vocab_size, 500).astype(np.uint16)
    curve: list = []
    train(model, opt, s, data, data, np.arange(0, 64, 8), TINY.block_size, torch.device("cpu"), LoopState(0, []),
          lambda metric, value, step: curve.append((metric, value, step)), slow)
    return curve


def test_tokens_per_s_leaves_out_evaluation_and_checkpoints(monkeypatch):
    curve = _tiny_run(monkeypatch, S, slow_s=1000.0)
    tokens_per_step = S.micro_batch * S.grad_accum * TINY.block_size
    rates = [v for m, v, _ in curve if m == "tokens_per_s"]
    assert len(rates) == 2
    # a tiny step takes milliseconds (seconds on a machine under any load); with the 2000 s of evaluation and
    # checkpoint per logged window counted it would take more than 1000 s
    assert all(tokens_per_step / r < 100.0 for r in rates), rates


def test_tokens_per_s_leaves_out_the_compiling_step(monkeypatch):
    class SlowFirstCall(torch.nn.Module):  # stands in for torch.compile: the first call compiles
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, *args):
            self.calls += 1
            if self.calls == 1:  # compiling: 1000 s on train.py's clock (_JumpingClock), no sleeping
                train_mod.time.offset += 1000.0
            return self.inner(*args)

    monkeypatch.setattr(train_mod.torch, "compile", SlowFirstCall)
    s = replace(S, compile=True, log_every=2, eval_every=100, checkpoint_every=100)
    curve = _tiny_run(monkeypatch, s, slow_s=0.0)
    tokens_per_step = s.micro_batch * s.grad_accum * TINY.block_size
    first = next(v for m, v, step in curve if m == "tokens_per_s" and step == 2)
    assert tokens_per_step / first < 100.0, first  # the 1000 s compilation is not a training step's time
