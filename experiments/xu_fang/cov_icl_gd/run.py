"""cov_icl_gd — Xu & Fang §4 (Cor. 4.1, Prop. 4.4), App. B.2, Fig. 1 a–d.

Setup. d_u = 16, d_w = 4. Every task draws a diagonal Σ_uu with entries ~ U[0.25, 1] and β with
i.i.d. N(0, 1) entries; demonstrations u_j ~ N(0, Σ_uu), w_j = βᵀu_j (noise-free); the prompt is
(u_1, w_1), ..., (u_{t-1}, w_{t-1}), (u_t, 0).
(a, b) A frozen single head with Θ_Q = Θ_K = S_u, Θ_V = S_w, its output rescaled by √d_u (which
cancels γ_Σ = 1/√d_u), against the one-step population GD target Σ_wu u_t = βᵀΣ_uu u_t (512 tasks).
(c, d) The 8-block residual stack of Eq. 3 with η = 10⁻², ŵ = −r_t^(K), against the population
iterate B^(K) u_t (256 tasks). Cosine and squared error vs the number of demonstrations t − 1.
Each task's demonstrations are one long sequence and every prompt length is a prefix of it, so all
lengths come from one pass (the per-length average is still over independent tasks).
Controls: the same heads on prompts whose labels are shuffled within the prompt (the context then
carries no u–w pairing), and, for the single head, the Bayes target βᵀu_t, which the head is *not*
predicted to reach (one GD step is not the regression solution when Σ_uu ≠ I).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.errors import UserError
from experiments.core.plotting import mean_band, mean_sem, metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.xu_fang.attention import cosine
from experiments.xu_fang.closed_forms import sigma_wu
from experiments.xu_fang.cov_icl_gd import CovIclGdConfig
from experiments.xu_fang.fitting import geometric_grid, loglog_fit
from experiments.xu_fang.gd import (
    population_gd_iterates,
    prompt_tokens,
    residual_stack_predictions,
    selectors,
    single_head_predictions,
)
from experiments.xu_fang.streams import ICLTasks, icl_tasks

SOURCE_SINGLE = "Xu & Fang Cor. 4.1, Fig 1a-b"
SOURCE_STACK = "Xu & Fang Prop. 4.4, Fig 1c-d"


def shuffle_labels(tasks: ICLTasks, generator: torch.Generator) -> ICLTasks:
    """The control prompt: each task's targets permuted across its demonstrations (vectorized)."""
    order = torch.rand(tasks.w.shape[:2], generator=generator).argsort(dim=1)
    w = torch.gather(tasks.w, 1, order.unsqueeze(-1).expand_as(tasks.w))
    return ICLTasks(tasks.u, w, tasks.u_query, tasks.sigma_uu, tasks.beta)


def apply(matrix: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """M u per task: (B, d_w, d_u), (B, d_u) -> (B, d_w)."""
    return (matrix @ u.unsqueeze(-1)).squeeze(-1)


def scores_against(pred: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per task and prompt length: cosine and squared error of pred (B, N, d_w) vs target (B, d_w)."""
    target = target.unsqueeze(1).expand_as(pred).double()
    return {"cos": cosine(pred, target), "mse": ((pred.double() - target) ** 2).sum(-1)}


@torch.no_grad()
def single_head(cfg: CovIclGdConfig, generator: torch.Generator, device, dtype) -> dict[str, torch.Tensor]:
    c = cfg.single
    tasks = icl_tasks(c.tasks, c.max_demos, cfg.d_u, cfg.d_w, generator, cfg.diag_low, cfg.diag_high, cfg.noise_std)
    control = shuffle_labels(tasks, generator)
    s_u, s_w = selectors(cfg.d_u, cfg.d_w, dtype, device)

    def head(t: ICLTasks) -> torch.Tensor:  # the frozen selector head, run in the run's dtype
        t = t.to(dtype, device)
        context, query = prompt_tokens(t.u, t.w, t.u_query)
        return single_head_predictions(context, query, s_u, s_u, s_w).cpu()

    pred, pred_control = head(tasks), head(control)
    one_step = apply(sigma_wu(tasks.beta, tasks.sigma_uu), tasks.u_query)  # Σ_wu u_t
    bayes = apply(tasks.beta.transpose(-1, -2), tasks.u_query)  # B* u_t = βᵀ u_t
    main, ctrl = scores_against(pred, one_step), scores_against(pred_control, one_step)
    return {"cos": main["cos"], "mse": main["mse"], "target_sq": (one_step**2).sum(-1),
            "cos_bayes": scores_against(pred, bayes)["cos"], "cos_shuffled": ctrl["cos"], "mse_shuffled": ctrl["mse"]}


@torch.no_grad()
def residual_stack(cfg: CovIclGdConfig, generator: torch.Generator, device, dtype) -> dict[str, torch.Tensor]:
    c = cfg.stack
    tasks = icl_tasks(c.tasks, c.max_demos, cfg.d_u, cfg.d_w, generator, cfg.diag_low, cfg.diag_high, cfg.noise_std)
    control = shuffle_labels(tasks, generator)

    def stack(t: ICLTasks) -> torch.Tensor:  # (K+1, B, N, d_w): ŵ after each block
        t = t.to(dtype, device)
        return residual_stack_predictions(t.u, t.w, t.u_query, c.eta, c.layers).cpu()

    preds, preds_control = stack(tasks), stack(control)
    iterates = population_gd_iterates(tasks.sigma_uu, sigma_wu(tasks.beta, tasks.sigma_uu), c.eta, c.layers)
    target = apply(iterates[-1], tasks.u_query)  # B^(K) u_t
    main, ctrl = scores_against(preds[-1], target), scores_against(preds_control[-1], target)
    # What blocks 2..K add against what GD steps 2..K add. With a small η every iterate points along
    # Σ_wu u_t (cos 0.99999 between B^(8) u_t and B^(1) u_t), so cos(ŵ^(K), B^(K) u_t) cannot tell K blocks
    # from one (a 1-block stack scores 0.960 against 0.967); the depth's own contribution can.
    depth_cos = scores_against(preds[-1] - preds[1], target - apply(iterates[1], tasks.u_query))["cos"]
    # How far K steps are from one scaled step: with a small η, B^(K) ≈ Kη Σ_wu (same direction).
    one_step_dir = cosine(target, apply(iterates[1], tasks.u_query))
    # Depth resolution at the longest prompt: block k against iterate k.
    depth = torch.stack([((preds[k, :, -1].double() - apply(iterates[k], tasks.u_query)) ** 2).sum(-1).mean()
                         / (apply(iterates[k], tasks.u_query) ** 2).sum(-1).mean() for k in range(1, c.layers + 1)])
    return {"cos": main["cos"], "mse": main["mse"], "target_sq": (target**2).sum(-1),
            "cos_shuffled": ctrl["cos"], "mse_shuffled": ctrl["mse"], "cos_target_vs_one_step": one_step_dir,
            "cos_depth": depth_cos,
            "depth_rel_mse": depth}


def log_curves(ctx: RunContext, head: str, result: dict, grid: np.ndarray, index: dict) -> dict:
    """Task means (and their standard errors) at each logged prompt length; returns the full curves."""
    curves = {}
    scale = result["target_sq"].mean()
    for name in ("cos", "mse", "cos_bayes", "cos_shuffled", "mse_shuffled", "cos_depth"):
        if name not in result:
            continue
        values = result[name]
        mean, sem = values.mean(0), values.std(0) / values.shape[0] ** 0.5
        curves[name] = mean
        for n in grid:
            ctx.log(f"{name}_{head}", mean[n - 1], n_demos=int(n), **index)
            ctx.log(f"{name}_{head}_sem", sem[n - 1], n_demos=int(n), **index)
            if name == "mse":
                ctx.log(f"rel_mse_{head}", mean[n - 1] / scale, n_demos=int(n), **index)
    curves["rel_mse"] = curves["mse"] / scale
    return curves


def run(cfg: CovIclGdConfig, ctx: RunContext) -> None:
    generator = torch.Generator().manual_seed(cfg.seed)
    index = dict(seed=cfg.seed, dtype=dtype_name(ctx.dtype))
    with progress(2, "cov_icl_gd") as bar:
        single = single_head(cfg, generator, ctx.device, ctx.dtype)
        single_curves = log_curves(ctx, "single", single, geometric_grid(cfg.single.max_demos, cfg.grid_points), index)
        bar.advance(1, info=f"single head cos={single_curves['cos'][-1]:.3f}")
        stack = residual_stack(cfg, generator, ctx.device, ctx.dtype)
        index = dict(index, eta=cfg.stack.eta)  # the stack's curves depend on η: a sweep gets one series each
        stack_curves = log_curves(ctx, "stack", stack, geometric_grid(cfg.stack.max_demos, cfg.grid_points), index)
        for k, v in enumerate(stack["depth_rel_mse"], start=1):
            ctx.log("depth_rel_mse_stack", v, layer=k, n_demos=cfg.stack.max_demos, **index)
        ctx.log("cos_target_vs_one_step_stack", stack["cos_target_vs_one_step"].mean(), **index)
        bar.advance(1, info=f"stack cos={stack_curves['cos'][-1]:.3f}")
    check_claims(ctx, cfg, single_curves, stack_curves)


def check_claims(ctx: RunContext, cfg: CovIclGdConfig, single: dict, stack: dict) -> None:
    k = cfg.claims
    few = k.few_hundred
    layers = cfg.stack.layers
    # The stack's cosine claims judge the depth: what blocks 2..K add against what GD steps 2..K add (the
    # cosine of the whole output cannot tell K blocks from one at a small η; see residual_stack).
    depth = (f"cos(ŵ^({layers}) − ŵ^(1), B^({layers})u_t − B^(1)u_t): what blocks 2..{layers} add against what "
             f"GD steps 2..{layers} add")
    for key, head, curves, source, n_max, target, cos_name, what in (
            ("cor4_1.single_head", "single head", single, SOURCE_SINGLE, cfg.single.max_demos, "Σ_wu u_t", "cos",
             "cos(ŵ_t, Σ_wu u_t)"),
            ("prop4_4.stack", f"{layers}-block stack", stack, SOURCE_STACK, cfg.stack.max_demos, f"B^({layers}) u_t",
             "cos_depth", depth)):
        measure = what.split(":")[0]
        ctx.check(f"xu_fang.{key}_cos", source, f"{head}: {what} → 1 (mean over tasks at {n_max} "
                  "demonstrations)", curves[cos_name][-1], ">=", k.min_cosine, paper_value=1.0, measure=measure)
        ctx.check(f"xu_fang.{key}_rel_mse", source, f"{head}: MSE → 0 (MSE / E‖{target}‖² at {n_max} demonstrations)",
                  curves["rel_mse"][-1], "<=", k.max_rel_mse, paper_value=0.0)
        if few <= n_max:
            ctx.check(f"xu_fang.{key}_exact_at_few_hundred", "Xu & Fang §4.3",
                      f"{head}: 'essentially exact already at a few hundred demonstrations' ({what}, at {few} "
                      "demonstrations)", curves[cos_name][few - 1], ">=", k.few_hundred_min_cosine, paper_value=1.0,
                      measure=f"{measure} at {few} demonstrations")
        n = np.arange(1, len(curves["mse"]) + 1)
        grid = geometric_grid(len(n), 40, start=k.fit_min_n)
        slope = loglog_fit(grid, curves["mse"][grid - 1].numpy())[0]
        ctx.check(f"xu_fang.{key}_rate", "Xu & Fang Thm 3.6 / Cor. 3.7",
                  f"{head}: MSE decays like 1/n (log-log slope, n ≥ {k.fit_min_n})",
                  slope, "within", k.slope_tolerance, paper_value=-1.0)
        ctx.check(f"xu_fang.{key}_control_shuffled", source + " (control)",
                  f"{head}: labels shuffled within the prompt: |cos| with {target} at {n_max} demonstrations",
                  abs(float(curves["cos_shuffled"][-1])), "<=", k.max_control_cosine)
    ctx.check("xu_fang.cor4_1.one_gd_step_not_bayes", SOURCE_SINGLE + " (control)",
              "single head reads one GD step, not the Bayes solution: cos with Σ_wu u_t minus cos "
              f"with βᵀu_t at {cfg.single.max_demos} demonstrations",
              single["cos"][-1] - single["cos_bayes"][-1], ">=", k.min_bayes_gap)


# -- figure ------------------------------------------------------------------------------------

def _curve(ax, metrics: pd.DataFrame, name: str, label: str, color: str, ls: str = "-") -> None:
    """Mean over runs (seeds) of the task-mean curve, with a ±2 s.e. band over tasks."""
    frame = metric(metrics, name)
    if frame.empty:
        return
    agg = mean_sem(frame, "n_demos")  # several runs: mean over them; one run: the task mean itself
    sem = metric(metrics, name + "_sem")
    band = sem.groupby("n_demos")["value"].mean().reindex(agg["n_demos"]).to_numpy() if not sem.empty else 0
    mean_band(ax, agg, "n_demos", half=band, scale=2, color=color, ls=ls, lw=1.4, label=label)


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(4, width=3.2, height=2.9)
    (a, b, c, d) = axes[0]
    _curve(a, metrics, "cos_single", r"$\cos(\sqrt{d_u}\,y_t,\ \Sigma_{wu}u_t)$", "C0")
    _curve(a, metrics, "cos_bayes_single", r"vs Bayes $\beta^\top u_t$ (not the target)", "C2", "-.")
    _curve(a, metrics, "cos_shuffled_single", "control: labels shuffled", "0.5", ":")
    _curve(b, metrics, "mse_single", r"$\|\sqrt{d_u}\,y_t - \Sigma_{wu}u_t\|^2$", "C0")
    _curve(b, metrics, "mse_shuffled_single", "control: labels shuffled", "0.5", ":")
    etas = sorted(metrics["eta"].dropna().unique()) if "eta" in metrics else []
    for i, eta in enumerate(etas):  # one series per step size when a sweep is combined
        sub = metrics[metrics["eta"] == eta]
        tag = f" (η = {eta:g})" if len(etas) > 1 else ""
        color = f"C{1 + i}"
        _curve(c, sub, "cos_stack", r"$\cos(\hat w_t^{(K)},\ B^{(K)}u_t)$" + tag, color)
        _curve(c, sub, "cos_shuffled_stack", "control: labels shuffled" + tag, color if tag else "0.5", ":")
        _curve(d, sub, "mse_stack", r"$\|\hat w_t^{(K)} - B^{(K)}u_t\|^2$" + tag, color)
        _curve(d, sub, "mse_shuffled_stack", "control: labels shuffled" + tag, color if tag else "0.5", ":")
    titles = ["(a) Single head: cosine", "(b) Single head: MSE", "(c) Stacked heads: cosine", "(d) Stacked heads: MSE"]
    for i, (ax, title) in enumerate(zip(axes[0], titles, strict=True)):
        ax.axhline(1.0 if i % 2 == 0 else 0.0, color="k", ls="--", lw=0.8)
        ax.set(xscale="log", title=title, xlabel="number of demonstrations t − 1",
               ylabel="cosine similarity" if i % 2 == 0 else "mean squared error")
        ax.legend(fontsize=6.5, loc="lower right" if i % 2 == 0 else "upper right")
    return save_figure(fig, figures_dir, "fig1_cov_icl_gd")


def validate(cfg: CovIclGdConfig) -> None:
    require_positive(cfg, "d_u", "d_w", "grid_points", "single.tasks", "single.max_demos", "stack.tasks",
                     "stack.max_demos", "stack.layers")
    if not 0 < cfg.diag_low <= cfg.diag_high:
        raise UserError(f"need 0 < diag_low ≤ diag_high, got diag_low={cfg.diag_low}, diag_high={cfg.diag_high}")
    if not 0 < cfg.stack.eta < 2 / cfg.diag_high:
        raise UserError(f"stack.eta={cfg.stack.eta} must be in (0, 2/λ_max(Σ_uu)) = (0, {2 / cfg.diag_high:g}) "
                        "for the population GD recursion to be stable")
    if cfg.claims.fit_min_n * 4 > min(cfg.single.max_demos, cfg.stack.max_demos):
        raise UserError(f"claims.fit_min_n={cfg.claims.fit_min_n} leaves less than a factor 4 of demonstrations to fit")
