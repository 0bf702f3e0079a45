"""A plain training loop for the in-context linear-regression models (nanoGPT-style: a loop you
can read). Fresh tasks every batch; `evaluate(step)` is called at every checkpoint so the
experiment can measure whatever it needs there (e.g. validation loss with context and via ΔW)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig
from torch import nn

from experiments.core.config_schema import node_values
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.data.linreg import LinRegBatch, sample_prompts
from experiments.dherin.models.linreg import predict_query
from experiments.dherin.schema import LinregTrain


@dataclass(kw_only=True)
class TrainSettings(LinregTrain):
    """The loop's settings: the config's `train:` node (its schema, LinregTrain) and the task's shape."""

    n_examples: int
    d: int


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
            loss = regression_loss(predict_query(model, batch.tokens), batch.targets)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if s.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            on_step(step, loss.item())
            if step % s.eval_every == 0 or step == s.steps:
                model.eval()
                info = evaluate(step) or info
            bar.advance(1, info=f"train loss {loss.item():.4f} | {info}".rstrip(" |"))


def train_settings(cfg: DictConfig) -> TrainSettings:
    return TrainSettings(**node_values(cfg.train, LinregTrain), n_examples=cfg.task.n_examples, d=cfg.task.d)


def validation_set(cfg: DictConfig, device, dtype) -> LinRegBatch:
    """The fixed held-out prompts of cfg.eval (its own seed: the same set whatever the run's seed)."""
    return sample_prompts(cfg.eval.n_val_tasks, cfg.task.n_examples, cfg.task.d,
                          torch.Generator().manual_seed(cfg.eval.val_seed)).to(device, dtype)


def zero_predictor_loss(val: LinRegBatch) -> float:
    """The loss of ŷ = 0: the scale against which "the model learned the task" is judged."""
    return regression_loss(torch.zeros_like(val.targets), val.targets).item()


def progress_info(values: dict[str, float]) -> str:
    """The progress line's validation part. The loss via ΔW (no context, patched weights) equals the
    loss with the context by the paper's theorem, so it is shown as its relative gap to it, not as a
    second number that always reads the same; the control (no context, unpatched) shows what the
    context is worth."""
    ctx_loss, patched = values["val_loss_context"], values["val_loss_patched"]
    gap = abs(ctx_loss - patched) / abs(ctx_loss) if ctx_loss else abs(patched)
    same = "identical" if gap == 0 else f"the same to {gap:.1e} (rel.)"
    text = f"val loss {ctx_loss:.4f} with context, via ΔW {same}"
    if "val_loss_no_context" in values:
        text += f", no context {values['val_loss_no_context']:.4f}"
    return text


@dataclass
class Trained:
    val: LinRegBatch  # the fixed held-out validation set
    zero_loss: float  # the zero predictor's loss on it (the scale "learned" is judged against)
    generator: torch.Generator  # the training generator, to go on sampling fresh tasks after training


def train_validated(model: nn.Module, cfg: DictConfig, ctx: RunContext, index: dict[str, Any],
                    losses: Callable[[nn.Module, LinRegBatch], dict[str, float]]) -> Trained:
    """Train with cfg.train / cfg.task on fresh tasks, logging `train_loss` every step and, at every
    checkpoint, `losses(model, val)` (the validation loss computed both ways, and the control) and the
    zero predictor's loss, on the held-out set of cfg.eval (Figs. 2, 5 and 6 left/middle)."""
    val = validation_set(cfg, ctx.device, ctx.dtype)
    zero_loss = zero_predictor_loss(val)
    gen = torch.Generator().manual_seed(cfg.seed)

    def on_step(step: int, loss: float) -> None:
        ctx.log("train_loss", loss, step=step, **index)

    def evaluate(step: int) -> str:
        values = losses(model, val)
        ctx.log_many(values, step=step, **index)
        ctx.log("val_loss_zero_predictor", zero_loss, step=step, **index)
        return progress_info(values)

    train(model, train_settings(cfg), gen, ctx.device, ctx.dtype, on_step, evaluate)
    model.eval()
    return Trained(val, zero_loss, gen)


def claim_losses_agree(ctx: RunContext, dtype: torch.dtype, id: str, ref: str, via: str = "ΔW") -> pd.DataFrame:
    """Claim: the validation loss with the context equals the loss via the patch at every checkpoint
    (max relative gap, tolerance 1000 eps of the dtype). Returns the validation losses by step."""
    m = ctx.metrics()
    val = m[m["metric"].str.startswith("val_loss")].pivot_table(index="step", columns="metric", values="value")
    rel_gap = ((val["val_loss_context"] - val["val_loss_patched"]).abs() / val["val_loss_context"]).max()
    ctx.check(id, ref, f"validation loss with the context equals the loss via {via} without it, at every checkpoint "
              f"(max relative gap; bound 1000 eps of {dtype_name(dtype)})",
              rel_gap, "<=", 1000 * torch.finfo(dtype).eps)
    return val
