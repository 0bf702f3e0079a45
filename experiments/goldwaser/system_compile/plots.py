"""system_compile's figures, from metrics.csv alone: per system prompt and method, the held-out KL to the
prompted model and the behaviour check's pass rate (bars; the fit queries as dots, a construction for the
analytic patch); the bake's training curve beside the control's and the analytic patch's held-out KL; and
KL against compile seconds: every budget point on the validation queries, the chosen one on the held-out
queries, the Pareto front."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.core.plotting import new_figure, save_figure

COLORS = {"control": "0.6", "analytic": "tab:blue", "bake": "tab:orange", "reference": "k"}
LABELS = {"control": "control (no prompt)", "analytic": "analytic patch", "bake": "baked LoRA",
          "reference": "prompted (reference)"}


def _per_prompt(m: pd.DataFrame, metric: str, split: str) -> pd.DataFrame:
    rows = m[(m["metric"] == metric) & (m["split"] == split)]
    return rows.groupby(["prompt", "method"])["value"].mean().unstack("method")


def _bars(ax, held: pd.DataFrame, fit: pd.DataFrame, methods: list[str], prompts: list[str]) -> None:
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        x = np.arange(len(prompts)) + (j - (len(methods) - 1) / 2) * width
        if method in held:
            ax.bar(x, held[method].reindex(prompts).to_numpy(), width, color=COLORS[method], label=LABELS[method])
        if method in fit:
            ax.plot(x, fit[method].reindex(prompts).to_numpy(), "o", ms=3.5, mfc="w", mec="k", mew=0.8,
                    label="fit queries" if j == 0 else None)
    ax.set_xticks(np.arange(len(prompts)), prompts)


def _figure_heldout(m: pd.DataFrame, figures_dir: Path) -> list[Path]:
    prompts = list(dict.fromkeys(m.loc[m["metric"] == "kl", "prompt"]))
    methods = [x for x in ("control", "analytic", "bake") if x in set(m.loc[m["metric"] == "kl", "method"])]
    fig, axes = new_figure(2, 1, width=3.9, height=2.8)
    kl_ax, rate_ax = axes[0, 0], axes[0, 1]
    _bars(kl_ax, _per_prompt(m, "kl", "heldout"), _per_prompt(m, "kl", "fit"), methods, prompts)
    kl_ax.set_yscale("log")
    kl_ax.set_ylabel("KL(prompted ‖ model), nats/token")
    kl_ax.set_title("held-out queries: next-token KL", fontsize=8)
    _bars(rate_ax, _per_prompt(m, "behaviour", "heldout"), _per_prompt(m, "behaviour", "fit"),
          [*methods, "reference"], prompts)
    rate_ax.set_ylim(0, 1.05)
    rate_ax.set_ylabel("behaviour check passed, fraction")
    rate_ax.set_title("held-out queries: free generations", fontsize=8)
    rate_ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    model = str(m["model"].dropna().iloc[0]) if "model" in m else ""
    fig.suptitle(f"a system prompt compiled into weights ({model}); bars: held-out queries, dots: fit queries "
                 "(for the analytic patch a construction)", fontsize=7.5)
    return save_figure(fig, figures_dir, "heldout")


def _figure_curve(m: pd.DataFrame, figures_dir: Path) -> list[Path]:
    prompts = list(dict.fromkeys(m.loc[m["metric"] == "bake_kl", "prompt"]))
    fig, axes = new_figure(len(prompts), 1, width=3.2, height=2.5)
    held_kl = _per_prompt(m, "kl", "heldout")
    for ax, prompt in zip(axes[0], prompts, strict=True):
        rows = m[m["prompt"] == prompt]
        final = rows[rows["budget_point"].isna()] if "budget_point" in rows else rows  # not a sweep's points
        evals = final[final["metric"] == "bake_eval_kl"]
        where = f"{evals['split'].iloc[0]} KL" if len(evals) else ""
        for metric, style, label in (("bake_kl", "-", "training KL (fit continuations)"),
                                     ("bake_eval_kl", "o--", where)):
            s = final[final["metric"] == metric].groupby("step")["value"].mean().sort_index()
            if len(s):
                ax.plot(s.index, s.to_numpy(), style, ms=3, lw=1.1, color=COLORS["bake"], label=label,
                        alpha=1.0 if metric == "bake_eval_kl" else 0.6)
        for method, ls in (("control", ":"), ("analytic", "-.")):
            if method in held_kl and prompt in held_kl.index:
                ax.axhline(held_kl.loc[prompt, method], ls=ls, lw=1, color=COLORS[method],
                           label=f"{LABELS[method]}, held-out")
        ax.set_yscale("log")
        ax.set_xlabel("bake step")
        ax.set_title(prompt, fontsize=8)
    axes[0, 0].set_ylabel("KL(prompted ‖ model), nats/token")
    axes[0, 0].legend(fontsize=6)
    return save_figure(fig, figures_dir, "bake_curve")


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (seconds, KL) points no other point beats on both: sorted by seconds, each lower in KL than all
    before it."""
    front, best = [], np.inf
    for x, y in sorted(points):
        if y < best:
            front.append((x, y))
            best = y
    return front


def _sweep_points(m: pd.DataFrame, method: str) -> pd.DataFrame:
    """A budget sweep's points of `method`: validation KL and compile seconds per (prompt, budget_point)."""
    rows = m[(m["method"] == method) & (m["split"] == "validation")]
    if not len(rows) or "budget_point" not in rows:
        return pd.DataFrame(columns=["s", "kl"])
    wide = rows.pivot_table(index=["prompt", "budget_point"], columns="metric", values="value")
    if not {"compile_s", "validation_kl"} <= set(wide.columns):
        return pd.DataFrame(columns=["s", "kl"])
    return wide.rename(columns={"compile_s": "s", "validation_kl": "kl"})[["s", "kl"]].dropna()


def _figure_cost(m: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """KL against compile seconds. Filled: each (system prompt, method)'s compiled model on the held-out queries;
    hollow: a budget sweep's points on the validation queries, among which the filled one was chosen. The control
    as a line (no compile); the Pareto front over the sweep's points when there is a sweep (the held-out queries
    choose nothing), else over the held-out points."""
    held = _per_prompt(m, "kl", "heldout")
    final = m[(m["metric"] == "compile_s") & m["split"].isna()] if "split" in m else m[m["metric"] == "compile_s"]
    seconds = final.groupby(["prompt", "method"])["value"].mean().unstack("method")
    fig, axes = new_figure(1, 1, width=4.2, height=3.0)
    ax, held_points, sweep_points = axes[0, 0], [], []
    for method in ("analytic", "bake"):
        sweep = _sweep_points(m, method)
        if len(sweep):
            ax.plot(sweep["s"], sweep["kl"], "o", mfc="none", mec=COLORS[method], ms=5, alpha=0.8,
                    label=f"{LABELS[method]}: budget points, validation KL")
            sweep_points += list(zip(sweep["s"], sweep["kl"], strict=True))
        if method not in seconds or method not in held:
            continue
        both = pd.concat([seconds[method].rename("s"), held[method].rename("kl")], axis=1).dropna()
        ax.plot(both["s"], both["kl"], "o", color=COLORS[method], ms=5, alpha=0.9,
                label=f"{LABELS[method]}{': chosen, held-out KL' if len(sweep) else ''}")
        for prompt, row in both.iterrows():
            ax.annotate(str(prompt), (row["s"], row["kl"]), fontsize=5, xytext=(3, 2), textcoords="offset points")
        held_points += list(zip(both["s"], both["kl"], strict=True))
    if "control" in held:
        ax.axhline(float(held["control"].mean()), ls=":", color=COLORS["control"], label=LABELS["control"] + ", mean")
    front = pareto(sweep_points or held_points)
    if front:
        label = "Pareto front" + (" (validation)" if sweep_points else "")
        ax.step(*zip(*front, strict=True), where="post", color="k", lw=0.8, label=label)
        ax.plot(*zip(*front, strict=True), "s", mfc="none", mec="k", ms=9, mew=0.8)
    if all(x > 0 for x, _ in sweep_points + held_points):
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compile seconds (curve evaluations excluded)")
    ax.set_ylabel("KL(prompted ‖ model), nats/token")
    ax.legend(fontsize=5.5)
    return save_figure(fig, figures_dir, "kl_vs_compile_s")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    if metrics.empty or "method" not in metrics or "kl" not in set(metrics["metric"]):
        return []
    paths = _figure_heldout(metrics, figures_dir)
    if "bake_kl" in set(metrics["metric"]):
        paths += _figure_curve(metrics, figures_dir)
    if "compile_s" in set(metrics["metric"]):
        paths += _figure_cost(metrics, figures_dir)
    return paths
