"""gpt_wq's training loop reads values back to the host at log steps only (on CUDA each read waits for the
GPU), and copies host batches to CUDA through page-locked memory (a `non_blocking` copy from pageable
memory is synchronous)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.karbevski.gpt import train as train_module
from experiments.karbevski.gpt.model import GPT, GPTConfig
from experiments.karbevski.gpt.train import LoopState, TrainSettings, make_optimizer, to_device, train

TINY = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, d_model=16, mlp_hidden=64)
OURS = str(Path(train_module.__file__).parents[2])  # experiments/
S = TrainSettings(steps=6, micro_batch=2, grad_accum=1, lr=1e-3, min_lr=1e-4, warmup_steps=0, decay_steps=6,
                  weight_decay=0.1, eval_every=1000, eval_batch=4, log_every=1, checkpoint_every=1000)


def host_reads_between_logs(monkeypatch, settings: TrainSettings) -> list[int]:
    """The host reads (`item`, `float()`, `tolist`) the project's own code makes between one logged step
    and the next (torch's CPU AdamW reads its step counters, CPU tensors: on CUDA the fused one does not)."""
    reads, marks = [0], []
    for name in ("item", "__float__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            reads[0] += OURS in sys._getframe(1).f_code.co_filename
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    torch.manual_seed(0)
    model = GPT(TINY)
    opt = make_optimizer(model, settings, torch.device("cpu"))
    data = np.random.default_rng(0).integers(0, TINY.vocab_size, 500).astype(np.uint16)

    def log(metric, value, step):
        if metric == "train_loss":
            marks.append(reads[0])

    train(model, opt, settings, data, data, np.arange(0, 64, 8), TINY.block_size, torch.device("cpu"),
          LoopState(0, []), log, lambda step: None)
    return [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]


def test_host_reads_do_not_grow_with_steps_or_micro_batches(monkeypatch):
    every_step = host_reads_between_logs(monkeypatch, S)
    # 3 steps of 4 micro-batches between two logs: a read per micro-batch or per step would show here
    sparse = host_reads_between_logs(monkeypatch, replace(S, log_every=3, grad_accum=4))
    assert len(every_step) == 5 and len(sparse) == 1
    assert len(set(every_step)) == 1 and sparse[0] == every_step[0], (every_step, sparse)
    assert every_step[0] <= 3  # the loss, the gradient norm (and nothing per layer or per parameter)


def test_cuda_batches_go_through_pinned_memory(monkeypatch):
    calls = []
    real_to = torch.Tensor.to

    def pin(self):
        calls.append("pin")
        return self

    def to(self, device, non_blocking=False):
        calls.append(("to", str(device), non_blocking))
        return real_to(self, "meta")  # stands in for the GPU

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    assert to_device(torch.zeros(2, 3), torch.device("cuda", 0)).device.type == "meta"
    assert calls == ["pin", ("to", "cuda:0", True)]
    calls.clear()
    to_device(torch.zeros(2), torch.device("cpu"))
    assert calls == [("to", "cpu", False)]  # nothing pinned on the CPU (pinning needs CUDA)


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_the_logged_loss_is_the_mean_of_the_micro_batches(grad_accum):
    """The loss summed on the device, read at the log step, is the mean of each micro-batch's loss."""
    torch.manual_seed(0)
    model = GPT(TINY)
    s = replace(S, steps=1, grad_accum=grad_accum, lr=0.0, min_lr=0.0)
    opt = make_optimizer(model, s, torch.device("cpu"))
    data = np.random.default_rng(0).integers(0, TINY.vocab_size, 500).astype(np.uint16)
    with torch.no_grad():
        expected = np.mean([model(*train_module.random_batch(data, TINY.block_size, s.micro_batch, s.seed, 0, m))[1]
                            .item() for m in range(grad_accum)])
    logged = {}
    train(model, opt, s, data, data, np.arange(0, 64, 8), TINY.block_size, torch.device("cpu"), LoopState(0, []),
          lambda metric, value, step: logged.setdefault(metric, value), lambda step: None)
    assert logged["train_loss"] == pytest.approx(expected, rel=1e-5)
