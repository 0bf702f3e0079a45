"""The training loop, a plain loop as in nanoGPT's train.py: AdamW (β = 0.9, 0.95), linear warmup then
cosine decay to min_lr over `decay_steps` (which may be longer than the run: the authors decay over 600k
steps and stop at 100k), gradient clipping, gradient accumulation, bfloat16 autocast when the run's dtype
is bfloat16 (float32 weights and optimizer state; the paper's mixed precision), optional torch.compile,
DDP when torchrun started us, periodic validation on fixed windows, checkpoints.

Batches are a pure function of (seed, step, global micro-batch index) (data.token_bins.random_batch), so
a resumed run sees the batches the uninterrupted run would have, and N ranks with A accumulation steps
see exactly what one process with N·A accumulation steps sees.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from experiments.core import distributed
from experiments.data.token_bins import random_batch, windows_to_batch
from experiments.karbevski.gpt.model import param_groups
from experiments.karbevski.schema import GptTrain


@dataclass(kw_only=True)
class TrainSettings(GptTrain):
    """One rank's training loop: gpt_wq's `train:` node (its schema, GptTrain) as gpt_wq.settings resolves
    it for this rank, and what the run decides (seed, autocast dtype)."""

    seed: int = 0
    amp: torch.dtype | None = None  # bfloat16: autocast (float32 weights); None: float32 throughout

    def __post_init__(self) -> None:
        if self.decay_steps is None:  # the node's null: decay over the run
            self.decay_steps = self.steps
        if self.weight_decay is None:
            raise ValueError("weight_decay is null: gpt_wq.settings gives the variant's")


def lr_at(step: int, s: TrainSettings) -> float:
    """nanoGPT's get_lr: linear warmup, cosine from lr to min_lr between warmup_steps and decay_steps."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / (s.warmup_steps + 1)
    if step >= s.decay_steps:
        return s.min_lr
    ratio = (step - s.warmup_steps) / max(s.decay_steps - s.warmup_steps, 1)
    return s.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (s.lr - s.min_lr)


def make_optimizer(model: nn.Module, s: TrainSettings, device: torch.device) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, s.weight_decay), lr=s.lr, betas=(s.beta1, s.beta2),
                             fused=device.type == "cuda")


def autocast(device: torch.device, amp: torch.dtype | None):
    """Autocast to `amp` (bfloat16: the paper's mixed precision) on CUDA as on CPU; None: plain float32,
    also on CUDA (the run's dtype says which, and run.json records it)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp)


def precision(amp: torch.dtype | None) -> str:
    """What run.json records as the precision that ran."""
    return "float32" if amp is None else f"{str(amp).removeprefix('torch.')} autocast, float32 weights"


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on `device`: on CUDA through page-locked memory, so the copy is truly asynchronous (a
    `non_blocking` copy from pageable memory is a synchronous one)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(model: nn.Module, val: np.ndarray, starts: np.ndarray, block_size: int, batch: int,
             device: torch.device, amp: torch.dtype | None = None) -> float:
    """Mean next-token loss over the fixed validation windows (each rank scores its share)."""
    me = distributed.info()
    mine = starts[me.rank :: me.world_size]
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, window count
    for i in range(0, len(mine), batch):
        x, y = windows_to_batch(val, mine[i : i + batch], block_size)
        with autocast(device, amp):
            _, loss = model(to_device(x, device), to_device(y, device))
        total[0] += loss.double() * len(x)  # on the device: one host read per evaluation, not per batch
        total[1] += len(x)
    model.train(was_training)
    total = distributed.sum_over_ranks(total)
    return (total[0] / total[1]).item()


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done
    curve: list | None = None  # rows logged so far (kept in checkpoints, replayed on resume)


def train(model: nn.Module, optimizer, s: TrainSettings, train_data: np.ndarray, val_data: np.ndarray,
          val_starts: np.ndarray, block_size: int, device: torch.device, state: LoopState,
          log: Callable[[str, float, int], None], checkpoint: Callable[[int], None], bar=None) -> LoopState:
    """Run optimizer steps state.step+1 .. s.steps. `log(metric, value, step)` records a point of the
    curve; `checkpoint(step)` saves. Ctrl-C re-raises with the step reached (the last checkpoint is intact)."""
    me = distributed.info()
    ddp = model
    if me.distributed:
        ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    run_model = torch.compile(ddp) if s.compile else ddp
    tokens_per_step = s.micro_batch * s.grad_accum * block_size * me.world_size
    model.train()

    def val_point(step: int) -> None:
        log("val_loss", evaluate(model, val_data, val_starts, block_size, s.eval_batch, device, s.amp), step)

    if state.step == 0:
        val_point(0)
    # The loss and the gradient norm stay on the device and are read back at log steps only: a host read
    # per micro-batch would make the CPU wait for the GPU every step. tokens_per_s counts training steps
    # only (not evaluation, checkpoints, or the first step of a compiled model, its compilation); the clock
    # is read after the queued work is done, at log, evaluation and checkpoint steps.
    train_s, steps_window, clock = 0.0, 0, None
    step = first = state.step
    try:
        while step < s.steps:
            if clock is None:
                clock = time.perf_counter()
            lr = lr_at(step, s)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(s.grad_accum):
                x, y = random_batch(train_data, block_size, s.micro_batch, s.seed, step,
                                    me.rank * s.grad_accum + micro)
                x, y = to_device(x, device), to_device(y, device)
                # DDP averages gradients over ranks at the last micro-batch only
                sync = micro == s.grad_accum - 1 or not me.distributed
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    with autocast(device, s.amp):
                        _, loss = run_model(x, y)
                    (loss / s.grad_accum).backward()
                loss_sum += loss.detach().float()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if s.compile and step == first + 1:  # the step that compiled: not timed
                _sync(device)
                clock = None
            else:
                steps_window += 1
            logging = step % s.log_every == 0 or step == s.steps
            evaluating = step % s.eval_every == 0 or step == s.steps
            saving = step % s.checkpoint_every == 0 or step == s.steps
            if clock is not None and (logging or evaluating or saving):
                _sync(device)
                train_s += time.perf_counter() - clock
                clock = None
            info = None
            if logging:
                train_loss = distributed.mean_over_ranks(loss_sum.item() / s.grad_accum, device)
                log("train_loss", train_loss, step)
                log("lr", lr, step)
                log("grad_norm", grad_norm.item(), step)
                log("tokens_seen", step * tokens_per_step, step)
                if steps_window:
                    log("tokens_per_s", steps_window * tokens_per_step / max(train_s, 1e-9), step)
                train_s, steps_window = 0.0, 0
                info = f"loss {train_loss:.3f}"
            if evaluating:
                val_point(step)
            if saving:
                checkpoint(step)
            if bar is not None:
                bar.advance(1, info=info)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted at step {step} of {s.steps}; the last checkpoint "
                                f"(every {s.checkpoint_every} steps) is intact: resume=<this run folder>") from None
    state.step = step
    return state
