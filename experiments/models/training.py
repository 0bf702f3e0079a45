"""A plain training loop for the in-context linear-regression models (nanoGPT-style: a loop you
can read). Fresh tasks every batch; `evaluate(step)` is called at every checkpoint so the
experiment can measure whatever it needs there (e.g. validation loss with context and via ΔW)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from experiments.core.progress import progress
from experiments.data.linreg import sample_prompts
from experiments.models.linreg import predict


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int
    lr: float
    eval_every: int
    n_examples: int
    d: int
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0


def regression_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """L = 1/(2B) Σ (ŷ − y)² (Dherin et al. §4.1)."""
    return 0.5 * (pred - target).pow(2).mean()


def train(model: nn.Module, s: TrainSettings, generator: torch.Generator, device: torch.device,
          dtype: torch.dtype, on_step: Callable[[int, float], None],
          evaluate: Callable[[int], str | None]) -> None:
    """Adam on fresh tasks; `on_step(step, train_loss)` every step, `evaluate(step)` at step 0, every
    `eval_every` steps and at the end (it may return a short string for the progress bar)."""
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    info = evaluate(0) or ""
    with progress(s.steps, "train") as bar:
        for step in range(1, s.steps + 1):
            model.train()
            batch = sample_prompts(s.batch_size, s.n_examples, s.d, generator).to(device, dtype)
            loss = regression_loss(predict(model(batch.tokens)), batch.targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if s.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            on_step(step, loss.item())
            if step % s.eval_every == 0 or step == s.steps:
                model.eval()
                info = evaluate(step) or info
            bar.advance(1, info=f"loss {loss.item():.4f} {info}")
