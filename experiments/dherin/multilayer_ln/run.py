"""multilayer_ln — Dherin et al. App. C.1, Fig. 5.

Setup. Train a stack of L = 10 post-LN transformer blocks Φ⁽ⁱ⁾(x) = LayerNorm(y + MLP⁽ⁱ⁾(y)),
y = LayerNorm(x + MHA⁽ⁱ⁾(x)) (d_model = 32, 8 heads, d_mlp = 128, MLP with biases) on the same
in-context linear-regression prompts as Fig. 2 (d = 2, N = 100). Removing the context part Y
(all of C by default, or the first k examples with `patch.remove_first=k`) is absorbed into every
block's W₁⁽ⁱ⁾ (rank-1 ΔW) and b₂⁽ⁱ⁾ (δA), computed first block to last (App. C, Eq. 22). At every
checkpoint, the validation loss two ways — with the context, Φ_{W,b}(C, x), and via the patches
without Y, Φ_{W+ΔW,b+Δb}(C∖Y, x) — and the control: the unpatched model without Y. After training,
for 100 fresh tasks, the L2 norm of each block's output difference at the query (Fig. 5 right),
beside the same norm for the control.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.chunks import in_chunks
from experiments.core.errors import UserError
from experiments.core.plotting import mean_sem, metric, new_figure, save_figure
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import sample_prompts
from experiments.dherin.loss_panels import draw_loss_panels
from experiments.dherin.models.post_ln_stack import PostLNStack
from experiments.dherin.multilayer_ln import MultilayerLnConfig
from experiments.dherin.pretrained import loss_summary
from experiments.dherin.stack_patch import query_block_outputs_three_ways, stack_predictions_three_ways
from experiments.dherin.training import claim_losses_agree, train_validated

SOURCE = "Dherin App. C.1 Fig 5"


def build_model(cfg: MultilayerLnConfig) -> PostLNStack:
    m = cfg.model
    return PostLNStack(cfg.task.d, n_layers=m.n_layers, d_model=m.d_model, n_heads=m.n_heads, d_mlp=m.d_mlp)


def removed_examples(cfg: MultilayerLnConfig) -> int | None:
    """k of `patch.remove_first` (Y = the first k examples), or None for all of C (the paper's Y = C)."""
    k = cfg.patch.remove_first
    return None if k is None else int(k)


def validation_losses(model: PostLNStack, val, chunk: int, n_removed: int | None) -> dict[str, float]:
    preds = in_chunks(lambda t: stack_predictions_three_ways(model, t, n_removed), val.tokens, chunk)
    return loss_summary(preds, val.targets)


def block_differences(model: PostLNStack, cfg: MultilayerLnConfig, generator: torch.Generator, device, dtype,
                      n_removed: int | None) -> dict[str, np.ndarray]:
    """Per task and block (tasks, L): ‖Φ⁽ⁱ⁾_{W,b}(C,x) − Φ⁽ⁱ⁾_{W+ΔW,b+Δb}(C∖Y,x)‖₂, the same for the
    control (unpatched, without Y), and ‖Φ⁽ⁱ⁾(C,x)‖₂ for scale. Norms in float64 of the run-dtype outputs."""
    batch = sample_prompts(cfg.eval.block_tasks, cfg.task.n_examples, cfg.task.d, generator).to(device, dtype)
    out = in_chunks(lambda t: query_block_outputs_three_ways(model, t, n_removed), batch.tokens, cfg.eval.chunk)
    full = out["context"].double()
    return {"patched": (out["patched"].double() - full).norm(dim=-1).cpu().numpy(),
            "no_context": (out["no_context"].double() - full).norm(dim=-1).cpu().numpy(),
            "output": full.norm(dim=-1).cpu().numpy()}


def run(cfg: MultilayerLnConfig, ctx: RunContext) -> None:
    device, dtype = ctx.device, ctx.dtype
    k = removed_examples(cfg)
    index = dict(seed=cfg.seed, dtype=dtype_name(dtype), removed=cfg.task.n_examples if k is None else k)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device, dtype)
    trained = train_validated(model, cfg, ctx, index, lambda m, val: validation_losses(m, val, cfg.eval.chunk, k))

    diffs = block_differences(model, cfg, trained.generator, device, dtype, k)
    for name, values in diffs.items():
        for task, row in enumerate(values):
            for layer, v in enumerate(row, start=1):
                ctx.log(f"block_l2_{'norm' if name == 'output' else 'diff_' + name}", v, layer=layer, task=task,
                        **index)
    check_claims(ctx, dtype, diffs, trained.zero_loss)


def check_claims(ctx: RunContext, dtype: torch.dtype, diffs: dict[str, np.ndarray], zero_loss: float) -> None:
    val = claim_losses_agree(ctx, dtype, "dherin.fig5.val_loss_context_equals_patch", SOURCE + " left/middle",
                             via="the per-block patches")
    eps = torch.finfo(dtype).eps
    per_layer = diffs["patched"].mean(0)  # mean over tasks, one per block
    scale = float(diffs["output"].mean(0).max())
    ctx.check("dherin.fig5.block_outputs_equal", SOURCE + " right",
              "‖Φ⁽ⁱ⁾(C,x) − Φ⁽ⁱ⁾_patched(x)‖₂ at the query, mean over tasks, max over blocks "
              "(bound 100 eps × the largest mean block-output norm)", per_layer.max(), "<=", 100 * eps * scale,
              paper_value=1e-6, measure="max over blocks of mean ‖Φ⁽ⁱ⁾(C,x) − Φ⁽ⁱ⁾_patched(x)‖₂")
    orders = np.log10(diffs["no_context"].mean(0) / np.maximum(per_layer, 1e-300)).min()
    ctx.check("dherin.fig5.control_far_off", SOURCE + " (control)",
              "control (unpatched, without the removed context) is worse than the patch by orders of magnitude "
              "at every block (min over blocks of log10 ratio of mean L2 differences)", orders, ">=", 3.0,
              measure="min over blocks of log10(control diff / patch diff)")
    final = val.iloc[-1]
    ctx.check("dherin.fig5.model_learned", SOURCE + " left",
              "the post-LN stack learned the task: final validation loss / zero-predictor loss",
              final["val_loss_context"] / zero_loss, "<=", 0.1)


# -- figure ------------------------------------------------------------------------------------


def _label(frame: pd.DataFrame) -> pd.Series:
    """One series per (dtype, removed examples) configuration; seeds are averaged."""
    return frame["dtype"].astype(str) + ", Y = first " + frame["removed"].astype("Int64").astype(str)


def _n_tasks(metrics: pd.DataFrame) -> int:
    """How many (seed, task) samples each error bar averages."""
    rows = metric(metrics, "block_l2_diff_patched")
    return len(rows.drop_duplicates(["seed", "task"])) if not rows.empty else 0


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    metrics = metrics.copy()
    metrics["config"] = _label(metrics)
    fig, axes = new_figure(3, width=3.8, height=3.1)
    ax_loss, ax_close, ax_blocks = axes[0]
    draw_loss_panels(ax_loss, ax_close, metrics)
    configs = sorted(metrics["config"].unique())
    for ci, config in enumerate(configs):
        sub = metrics[metrics["config"] == config]
        suffix = f" [{config}]" if len(configs) > 1 else ""
        for name, label, marker in (("block_l2_diff_patched", "patched, without context", "o"),
                                    ("block_l2_diff_no_context", "control: unpatched, without context", "s")):
            s = metric(sub, name)
            if s.empty:
                continue
            agg = mean_sem(s, "layer")  # over tasks (and seeds)
            ax_blocks.errorbar(agg["layer"], agg["mean"], yerr=agg["sem"], marker=marker, ms=4, lw=1, capsize=2,
                               label=label + suffix, color=f"C{2 * ci + (marker == 's')}")
    ax_blocks.set(yscale="log", xlabel="block i", ylabel=r"$\|\Phi^{(i)}(C,x) - \Phi^{(i)}_{W+\Delta W}(x)\|_2$",
                  title=f"Block outputs: full context vs patched\n(mean ± s.e.m. over n = {_n_tasks(metrics)} tasks)")
    if not metric(metrics, "block_l2_diff_patched").empty:
        ax_blocks.set_xticks(sorted(metric(metrics, "block_l2_diff_patched")["layer"].unique()))
        ax_blocks.legend(loc="center right", fontsize=6.5)
    return save_figure(fig, figures_dir, "fig5_multilayer_ln")


def validate(cfg: MultilayerLnConfig) -> None:
    if cfg.model.d_model % cfg.model.n_heads:
        raise UserError(f"model.d_model={cfg.model.d_model} must be divisible by model.n_heads={cfg.model.n_heads}")
    require_positive(cfg, "model.n_layers", "train.steps", "train.batch_size", "train.eval_every", "task.n_examples",
                     "eval.n_val_tasks", "eval.block_tasks", "eval.chunk")
    k = cfg.patch.remove_first
    if k is not None and not 1 <= k <= cfg.task.n_examples:  # an integer or null: the schema types it
        raise UserError(f"patch.remove_first={k!r} must be null (all of the context) or an integer "
                        f"k in 1..task.n_examples={cfg.task.n_examples} (Y = the first k examples)")
