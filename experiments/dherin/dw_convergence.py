"""dw_convergence — Dherin et al. §3, §4.3, Fig. 3 (Proposition 3.1).

Setup. Take linreg_icl's trained one-block transformer (trained in the run with linreg_icl's
settings, or loaded with checkpoint=PATH) and 100 fresh tasks. For every task and every prefix
C_i = [c_1..c_i] of its context (i = 1..N) compute the patch (ΔW)_i = ΔW(C_i) of Cor. 2.5.1,
so Φ_W(C_i, x) = Φ_{W+(ΔW)_i}(x) (checked by a forward pass of the patched weights). Plot
‖(ΔW)_{i+1} − (ΔW)_i‖ (operator 2-norm and Frobenius) against i, mean ± s.e. over tasks. Check
Prop. 3.1: W_{i+1} = W_i − h ∇_W trace(Δ_iᵀ W), h = 1/‖A(x)‖², gradient by autograd. The
control: the same measurement on the untrained model (same architecture, its initial weights),
because a softmax average over i tokens moves by O(1/i) per added token whether or not it learned.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig

from experiments.core.errors import UserError
from experiments.core.plotting import mean_sem, metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.registry import Experiment
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import (
    decay_summary,
    increment_norms,
    prefix_contextual_outputs,
    prefix_patches_from_outputs,
    prop31_deltas,
    prop31_step,
)
from experiments.dherin.models.linreg import ContextualBlock
from experiments.dherin.patched_forward import W_NAME, forward_with
from experiments.dherin.pretrained import pretrained_block, untrained_block, validate_checkpoint

SOURCE = "Dherin §4.3 Fig 3"

# -- the measurement -------------------------------------------------------------------------------


@torch.no_grad()
def patch_errors(model: ContextualBlock, query: torch.Tensor, a_prefix: torch.Tensor, patches: torch.Tensor,
                 chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prefix length i: max over tasks of |Φ_W(C_i, x) − Φ_{W+(ΔW)_i}(x)| and of the control
    |Φ_W(C_i, x) − Φ_W(x)|. The patched side is a forward pass of the patched weights on x alone."""
    B, N = patches.shape[:2]
    with_context = model.mlp(a_prefix[:, 1:])  # Φ_W(C_i, x) = φ_W(A(C_i, x)), the block's own forward
    W = model.mlp.w1.weight + patches.reshape(B * N, *patches.shape[2:])
    queries = query.repeat_interleave(N, dim=0)  # task-major, like the flattened patches
    patched = torch.cat([forward_with(model, {W_NAME: W[i:i + chunk]}, queries[i:i + chunk])[:, -1]
                         for i in range(0, B * N, chunk)]).reshape(B, N, -1)
    no_context = model(query)[:, -1:]
    err = (patched - with_context).abs().amax(dim=(0, 2))
    ctrl = (no_context - with_context).abs().amax(dim=(0, 2))
    return err, ctrl


def prop31_errors(W0: torch.Tensor, a_prefix: torch.Tensor, patches: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per step i → i+1 (i = 0..N−1): max over tasks and entries of |W_{i+1} − (W_i − h ∇L_i(W_i))|,
    the control |W_{i+1} − W_i| (the error of not stepping), and max |W_{i+1}| (the scale)."""
    B, N = patches.shape[:2]
    weights = torch.cat([W0.expand(B, 1, *W0.shape), W0 + patches], dim=1)  # W_0 .. W_N
    stepped = prop31_step(weights[:, :-1], prop31_deltas(W0, a_prefix), a_prefix[:, :1].expand(B, N, -1))
    amax = lambda t: t.abs().amax(dim=(0, 2, 3))  # noqa: E731
    return amax(stepped - weights[:, 1:]), amax(weights[:, 1:] - weights[:, :-1]), amax(weights[:, 1:])


def run(cfg: DictConfig, ctx: RunContext) -> None:
    device, dtype = ctx.device, ctx.dtype
    index = dict(seed=cfg.seed, dtype=dtype_name(dtype))
    model, built = pretrained_block(cfg, ctx)
    control = untrained_block(built, cfg.seed, ctx)
    tasks = sample_prompts(cfg.dynamics.n_tasks, cfg.task.n_examples, built.task.d,
                           torch.Generator().manual_seed(cfg.dynamics.data_seed)).to(device, dtype)
    eps = torch.finfo(dtype).eps
    with progress(2, "prefix patches") as bar:
        for variant, net in (("trained", model), ("untrained", control)):
            a = prefix_contextual_outputs(net.contextual, tasks.tokens)  # A(C_i, x), i = 0..N
            W0 = net.mlp.w1.weight
            patches = prefix_patches_from_outputs(W0, a)  # (ΔW)_i, i = 1..N
            norms = increment_norms(patches)
            for name, values in norms.items():
                for (task, i), v in np.ndenumerate(values.double().cpu().numpy()):
                    ctx.log(f"increment_norm_{name}", v, context_length=i + 1, task=task, variant=variant, **index)
            mean_op2 = norms["op2"].double().mean(0).cpu().numpy()
            ctx.log_many(decay_summary(mean_op2, cfg.dynamics.tail_fraction), variant=variant, **index)
            gap = ((norms["op2"] - norms["fro"]).abs() / norms["fro"]).max()
            ctx.log("rank1_norm_gap", gap, variant=variant, **index)
            if variant == "trained":
                for (task, i), v in np.ndenumerate(torch.linalg.matrix_norm(patches).double().cpu().numpy()):
                    ctx.log("patch_norm_fro", v, context_length=i + 1, task=task, variant=variant, **index)
                p31 = prop31_errors(W0, a, patches)
                err, ctrl = patch_errors(net, tasks.query, a, patches, cfg.eval.chunk)
                for i in range(patches.shape[1]):
                    ctx.log_many({"prop31_max_abs_err": p31[0][i], "prop31_step_max_abs": p31[1][i],
                                  "weight_max_abs": p31[2][i]}, step_from=i, **index)
                    ctx.log_many({"patch_max_abs_err": err[i], "no_context_max_abs_diff": ctrl[i]},
                                 context_length=i + 1, **index)
                trained = dict(p31=p31, err=err, ctrl=ctrl, mean=mean_op2)
            bar.advance(1, info=variant)
    check_claims(ctx, cfg, dtype, eps, trained)


def check_claims(ctx: RunContext, cfg: DictConfig, dtype: torch.dtype, eps: float, t: dict) -> None:
    err, step, scale = (x.double().max().item() for x in t["p31"])
    ctx.check("dherin.prop3_1.gradient_step", "Dherin §3 Prop 3.1",
              "W_(i+1) = W_i − h ∇_W trace(Δ_iᵀ W), h = 1/‖A(x)‖², autograd gradient; max |error| over i and tasks "
              f"(bound 100 eps of {dtype_name(dtype)} × max(1, max|W|))", err, "<=", 100 * eps * max(1.0, scale))
    ctx.check("dherin.prop3_1.control_not_stepping", "Dherin §3 Prop 3.1 (control)",
              "not stepping (W_(i+1) ≈ W_i) is off by orders of magnitude more (log10 of max step / max error)",
              math.log10(step / max(err, 1e-300)), ">=", 3.0)
    out_scale = max(1.0, t["ctrl"].double().max().item())
    ctx.check("dherin.sec3.prefix_patch_equals_context", "Dherin §4.3 Eqs 6-9",
              "Φ_W(C_i,x) = Φ_(W+(ΔW)_i)(x) for every prefix C_i (max |diff| over i, tasks, output entries; "
              "bound 100 eps × max(1, largest control difference))", t["err"].double().max().item(), "<=",
              100 * eps * out_scale)
    ctx.check("dherin.sec3.control_far_off", "Dherin §4.3 Eqs 6-9 (control)",
              "the unpatched model without context is orders of magnitude further "
              "(log10 of mean control diff / mean patch error)",
              math.log10(t["ctrl"].double().mean().item() / max(t["err"].double().mean().item(), 1e-300)), ">=", 3.0)
    s = decay_summary(t["mean"], cfg.dynamics.tail_fraction)
    pct = round(100 * cfg.dynamics.tail_fraction)
    ctx.check("dherin.fig3.increments_decay", SOURCE,
              f"increments ‖(ΔW)_(i+1) − (ΔW)_i‖₂ decay toward zero: mean over the last {pct}% of i / mean over the "
              f"first {pct}% (mean over tasks)", s["decay_ratio_tail_to_head"], "<=", 0.1)
    ctx.check("dherin.fig3.increments_power_law", SOURCE,
              "increments decay at least like i^(−1/2): fitted power-law exponent of the mean increment (i ≥ 2)",
              s["decay_fit_slope"], "<=", -0.5)


# -- figure ----------------------------------------------------------------------------------------

VARIANTS = {"trained": dict(color="C0", label="trained model"),
            "untrained": dict(color="0.5", ls="--", label="control: untrained model")}


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(3, width=3.7, height=3.1)
    ax_lin, ax_log, ax_p31 = axes[0]
    dtypes = sorted(metrics["dtype"].dropna().unique())
    for di, dt in enumerate(dtypes):
        sub = metrics[metrics["dtype"] == dt]
        suffix = f" [{dt}]" if len(dtypes) > 1 else ""
        for variant, style in VARIANTS.items():
            style = {**style, "label": style["label"] + suffix, "color": style["color"] if di == 0 else f"C{di + 2}"}
            for name, ax_style in (("increment_norm_op2", {}), ("increment_norm_fro", dict(marker=".", lw=0))):
                rows = metric(sub, name)
                rows = rows[rows["variant"] == variant] if "variant" in rows else rows.iloc[0:0]
                if rows.empty:
                    continue
                agg = mean_sem(rows, "context_length")
                label = style["label"] + (" (Frobenius)" if name.endswith("fro") else " (2-norm)")
                for ax in (ax_lin, ax_log):
                    kw = {**style, **ax_style, "label": label}
                    if name.endswith("fro"):
                        kw.pop("ls", None)
                        kw.update(ms=2.5, alpha=0.6)
                    ax.plot(agg["context_length"], agg["mean"], **kw)
                    if name.endswith("op2"):
                        ax.fill_between(agg["context_length"], agg["mean"] - agg["sem"], agg["mean"] + agg["sem"],
                                        color=style["color"], alpha=0.25, lw=0)
            fit = sub[(sub["metric"] == "decay_fit_slope") & (sub["variant"] == variant)]
            if not fit.empty:
                c = sub[(sub["metric"] == "decay_fit_log_c") & (sub["variant"] == variant)]["value"].mean()
                slope = fit["value"].mean()
                i = np.arange(2, int(metric(sub, "increment_norm_op2")["context_length"].max()) + 1)
                ax_log.plot(i, np.exp(c) * i ** slope, color="k", lw=0.7, ls=":")
                ax_log.text(i[-1], np.exp(c) * i[-1] ** slope, f" i^{slope:.2f}", fontsize=7, va="bottom",
                            ha="right")
        for name, label, style in (("prop31_max_abs_err", "Prop 3.1: max |W_(i+1) − (W_i − h∇L_i)|", dict(c="C0")),
                                   ("prop31_step_max_abs", "control: max |W_(i+1) − W_i|", dict(c="0.5", ls="--")),
                                   ("patch_max_abs_err", "max |Φ_W(C_i,x) − Φ_(W+(ΔW)_i)(x)|", dict(c="C1")),
                                   ("no_context_max_abs_diff", "control: max |Φ_W(C_i,x) − Φ_W(x)|",
                                    dict(c="C3", ls=":"))):
            rows = metric(sub, name)
            if rows.empty:
                continue
            x = "step_from" if name.startswith("prop31") else "context_length"
            g = rows.groupby(x)["value"].max().reset_index()
            ax_p31.plot(g[x], g["value"].clip(lower=1e-20), label=label + suffix, lw=1.1, **style)
    ax_lin.set(xlabel="context length i", ylabel=r"$\|(\Delta W)_{i+1} - (\Delta W)_i\|$",
               title=r"Convergence of $(\Delta W)_i$ (mean ± s.e. over tasks)")
    ax_log.set(xscale="log", yscale="log", xlabel="context length i", ylabel=r"$\|(\Delta W)_{i+1} - (\Delta W)_i\|$",
               title="Same, log–log, with power-law fits")
    ax_p31.set(yscale="log", xlabel="context length i", ylabel="max abs difference",
               title="Prop. 3.1 step and prefix patch, exactness")
    for ax in (ax_lin, ax_log, ax_p31):
        ax.legend(fontsize=6, loc="upper right")
    return save_figure(fig, figures_dir, "fig3_dw_convergence")


def validate(cfg: DictConfig) -> None:
    require_positive(cfg, "dynamics.n_tasks", "task.n_examples", "eval.chunk", "eval.n_val_tasks", "train.steps")
    if cfg.task.n_examples < 3:
        raise UserError(f"task.n_examples={cfg.task.n_examples}: the dynamics needs at least 3 examples")
    if not 0 < cfg.dynamics.tail_fraction <= 0.5:
        raise UserError(f"dynamics.tail_fraction={cfg.dynamics.tail_fraction} must be in (0, 0.5]")
    if cfg.model.mlp_skip:
        raise UserError("model.mlp_skip=true: §3's dynamics is for the block without MLP skip (ΔW alone)")
    validate_checkpoint(cfg)


EXPERIMENT = Experiment(
    name="dw_convergence",
    paper="Dherin et al.",
    figures="Fig. 3",
    description="the prefix patches (ΔW)_i form gradient steps (Prop. 3.1) whose increments vanish with i",
    run=run,
    plot=plot,
    validate=validate,
)
