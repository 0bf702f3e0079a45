"""linreg_icl — Dherin et al. §4.1–4.2, Fig. 2.

Setup. Train one transformer block (causal 8-head softmax attention, no positional encoding, no
LayerNorm, MLP φ_W(z) = W′ReLU(Wz + b) + b′ without skip) on prompts
(x_1, ωᵀx_1, ..., x_N, ωᵀx_N, x_query) with fresh ω ~ N(0, I_d) every batch. At every checkpoint,
measure the validation loss on a fixed held-out set two ways: with the context, Φ_W(C, x), and
without it but with W patched by the rank-1 ΔW of Eq. 2, Φ_{W+ΔW}(x). Beside them, the control:
the unpatched model without context, Φ_W(x). After training, for 100 fresh tasks and every
point of a grid over (x1, x2), average |Φ_W(C, x) − Φ_{W+ΔW}(x)| (Fig. 2 right).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.errors import UserError
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import make_prompts
from experiments.dherin.linreg_icl import LinregIclConfig
from experiments.dherin.loss_panels import draw_loss_panels
from experiments.dherin.models.linreg import ContextualBlock
from experiments.dherin.patched_forward import predictions_three_ways
from experiments.dherin.pretrained import build_model, save_checkpoint, validation_losses
from experiments.dherin.training import claim_losses_agree, train_validated

SOURCE = "Dherin §4.2 Fig 2"


@torch.no_grad()
def grid_differences(model: ContextualBlock, cfg: LinregIclConfig, generator: torch.Generator, device, dtype):
    """Mean over fresh tasks of |Φ_W(C,x) − Φ_{W+ΔW}(x)| (and of the control) at each grid point."""
    e, d, n = cfg.eval, cfg.task.d, cfg.task.n_examples
    axis = torch.linspace(-e.grid_range, e.grid_range, e.grid_size)
    if d != 2:
        raise UserError("the Fig. 2 grid needs task.d=2")
    x1, x2 = torch.meshgrid(axis, axis, indexing="ij")
    points = torch.stack([x1.flatten(), x2.flatten()], dim=-1)  # (G², 2)
    G = len(points)
    sums = {"patched": torch.zeros(G, dtype=torch.float64), "no_context": torch.zeros(G, dtype=torch.float64),
            "output": torch.zeros(G, dtype=torch.float64)}
    queries = torch.cat([points, torch.zeros(G, 1)], dim=-1).unsqueeze(1).to(device, dtype)  # (G, 1, d+1)
    with progress(e.grid_tasks, "grid") as bar:
        for _ in range(e.grid_tasks):
            w = torch.randn(1, d, generator=generator)
            xs = torch.randn(1, n, d, generator=generator)
            context = make_prompts(w, xs, xs[:, 0]).context.to(device, dtype)  # (1, N, d+1)
            # every grid point is a query against the same context: one KV cache, G query tokens
            p = predictions_three_ways(model, queries, cache=model.contextual.cache(context))
            y = p["context"].double().cpu()
            sums["patched"] += (y - p["patched"].double().cpu()).abs()
            sums["no_context"] += (y - p["no_context"].double().cpu()).abs()
            sums["output"] += y.abs()
            bar.advance(1)
    means = {k: (v / e.grid_tasks).numpy() for k, v in sums.items()}
    return points.numpy(), means


def run(cfg: LinregIclConfig, ctx: RunContext) -> None:
    device, dtype = ctx.device, ctx.dtype
    index = dict(seed=cfg.seed, dtype=dtype_name(dtype), mlp_skip=cfg.model.mlp_skip)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device, dtype)
    trained = train_validated(model, cfg, ctx, index, lambda m, val: validation_losses(m, val, cfg.eval.chunk))
    save_checkpoint(model, cfg, ctx.path("model.pt"))

    points, means = grid_differences(model, cfg, trained.generator, device, dtype)
    for (x1, x2), dp, dc, out in zip(points, means["patched"], means["no_context"], means["output"], strict=True):
        ctx.log("grid_abs_diff_patched", dp, x1=x1, x2=x2, **index)
        ctx.log("grid_abs_diff_no_context", dc, x1=x1, x2=x2, **index)
        ctx.log("grid_abs_output", out, x1=x1, x2=x2, **index)
    check_claims(ctx, dtype, means, trained.zero_loss)


def check_claims(ctx: RunContext, dtype: torch.dtype, grid: dict[str, np.ndarray], zero_loss: float) -> None:
    val = claim_losses_agree(ctx, dtype, "dherin.fig2.val_loss_context_equals_patch", SOURCE + " left/middle")
    eps = torch.finfo(dtype).eps
    scale = max(1.0, float(grid["output"].max()))
    ctx.check("dherin.fig2.patch_equals_context", SOURCE + " right",
              "|Φ_W(C,x) − Φ_(W+ΔW)(x)| on the (x1,x2) grid, mean over tasks, max over the grid "
              "(bound 100 eps × max(1, max|ŷ|))", grid["patched"].max(), "<=", 100 * eps * scale, paper_value=1e-7,
              measure="max over the grid of mean |Φ_W(C,x) − Φ_(W+ΔW)(x)|")
    orders = math.log10(grid["no_context"].mean() / max(grid["patched"].mean(), 1e-300))
    ctx.check("dherin.fig2.control_far_off", SOURCE + " (control)",
              "control (unpatched, no context) is worse than the patch by orders of magnitude "
              "(log10 ratio of mean grid errors)", orders, ">=", 3.0, measure="log10(control error / patch error)")
    final = val.iloc[-1]
    ctx.check("dherin.sec4_1.model_learned", "Dherin §4.1",
              "the model learned the task: final validation loss with context / zero-predictor loss",
              final["val_loss_context"] / zero_loss, "<=", 0.1, measure="val. loss / zero-predictor loss")


# -- figure ------------------------------------------------------------------------------------

def _label(frame: pd.DataFrame) -> pd.Series:
    """One series per (dtype, mlp_skip) configuration; seeds are averaged."""
    skip = frame["mlp_skip"].map({True: " MLP skip", False: ""}).fillna("")
    return frame["dtype"].astype(str) + skip


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    metrics = metrics.copy()
    metrics["config"] = _label(metrics)
    heats = [(frame, title, label) for frame, title, label in (
        (metric(metrics, "grid_abs_diff_patched"), r"$|\Phi_W(C,x) - \Phi_{W+\Delta W}(x)|$" + "\n(mean over tasks)",
         "patch error, mean |difference|\n(paper: up to ~1e-7)"),
        (metric(metrics, "grid_abs_diff_no_context"),
         r"control: $|\Phi_W(C,x) - \Phi_W(x)|$" + "\n(unpatched, no context)",
         "control error, mean |difference|\n(its own scale)"),
    ) if not frame.empty]  # an interrupted run has no grid yet: no empty panel slots
    fig, axes = new_figure(2 + len(heats), width=3.6, height=3.2)
    ax_loss, ax_close, *ax_heats = axes[0]
    draw_loss_panels(ax_loss, ax_close, metrics)
    for ax, (frame, title, label) in zip(ax_heats, heats, strict=True):
        _heat(fig, ax, frame, title, label)
    return save_figure(fig, figures_dir, "fig2_linreg_icl")


def _heat(fig, ax, frame: pd.DataFrame, title: str, cbar_label: str) -> None:
    """One heat map over the (x1, x2) grid; the colorbar says what it measures, since the patch error and
    the control differ by orders of magnitude (each has its own scale)."""
    if frame.empty:
        ax.set_axis_off()
        return
    grid = frame.groupby(["x1", "x2"])["value"].mean().unstack("x2")  # averaged over runs too
    x1, x2 = grid.index.to_numpy(), grid.columns.to_numpy()
    im = ax.imshow(grid.to_numpy().T, origin="lower", aspect="auto", cmap="viridis",
                   extent=(x1.min(), x1.max(), x2.min(), x2.max()))
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cb.formatter.set_powerlimits((-2, 2))
    cb.update_ticks()
    cb.set_label(cbar_label, fontsize=8)
    cb.ax.tick_params(labelsize=8)
    ax.set(xlabel="$x_1$", ylabel="$x_2$")
    ax.set_title(title, pad=14)  # room for the colorbar's ×10^k offset above it
    ax.grid(False)


def validate(cfg: LinregIclConfig) -> None:
    if cfg.task.d != 2:
        raise UserError(f"task.d={cfg.task.d}: Fig. 2's grid is over (x1, x2), so linreg_icl needs task.d=2")
    if cfg.model.d_model % cfg.model.n_heads:
        raise UserError(f"model.d_model={cfg.model.d_model} must be divisible by model.n_heads={cfg.model.n_heads}")
    require_positive(cfg, "train.steps", "train.batch_size", "train.eval_every", "task.n_examples",
                     "eval.n_val_tasks", "eval.grid_tasks", "eval.grid_size", "eval.chunk")
    if cfg.eval.grid_size % 2:
        raise UserError(f"eval.grid_size={cfg.eval.grid_size} must be even: an odd grid contains x = 0, "
                        "where A(x) = 0 and the patch ΔW is undefined (Theorem 2.2 needs A(x) ≠ 0)")
