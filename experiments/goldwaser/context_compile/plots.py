"""context_compile's figures, from metrics.csv alone: top-1 agreement and TVD against the position in the
reply, one line per k (the fixed patch), with the per-token patch (upper bound) and the unpatched model
without context (control) beside them; and the per-layer least-squares residual of the output rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.core.plotting import new_figure, save_figure


def _mean_by_position(rows: pd.DataFrame, name: str) -> pd.Series:
    return rows[rows["metric"] == name].groupby("position")["value"].mean().sort_index()


def _figure_agreement(m: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(1, 2, width=7.5, height=2.6, sharex=True)
    ks = sorted(int(k) for k in m.loc[m["method"] == "fixed", "k"].dropna().unique())
    colors = dict(zip(ks, ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink",
                           "tab:olive", "tab:cyan"] * 4, strict=False))
    n_prompts = int(m["prompt"].nunique())
    for ax, (name, label) in zip(axes[:, 0], (("top1_match", "top-1 agreement"), ("tvd", "TVD")), strict=True):
        for k in ks:
            series = _mean_by_position(m[(m["method"] == "fixed") & (m["k"] == k)], name)
            ax.plot(series.index, series.to_numpy(), lw=1.2, color=colors[k], label=f"fixed patch, k={k}")
            if k - 1 in series.index:  # the last fitted position
                ax.plot([k - 1], [series.loc[k - 1]], "|", color=colors[k], ms=10, mew=2)
        for method, style, label_text in (("per_token", dict(ls="--", color="k"), "per-token patch (upper bound)"),
                                          ("control", dict(ls=":", color="0.5"), "control: unpatched, no context")):
            series = _mean_by_position(m[m["method"] == method], name)
            if len(series):
                ax.plot(series.index, series.to_numpy(), lw=1.2, label=label_text, **style)
        ax.set_ylabel(label)
        if name == "tvd":
            ax.set_yscale("log")
        else:
            ax.set_ylim(-0.03, 1.03)
    axes[0, 0].legend(fontsize=6, loc="lower left", ncol=2)
    axes[-1, 0].set_xlabel("position in the reply (| marks the last fitted position of each k)")
    model = str(m["model"].dropna().iloc[0]) if "model" in m else ""
    dtype = str(m["dtype"].dropna().iloc[0]) if "dtype" in m else ""
    fig.suptitle(f"one fixed patch fitted at the first k positions vs the model given the prompt "
                 f"({model}, {dtype}; mean over {n_prompts} prompt{'s' * (n_prompts > 1)})", fontsize=8)
    return save_figure(fig, figures_dir, "agreement_vs_position")


def _figure_layers(m: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(2, 1, width=3.8, height=2.6)
    rows = m[m["layer"].notna()]
    for ax, (name, label) in zip(axes[0], (("output_residual", "output rule's LS residual ‖R−fit‖/‖R‖"),
                                           ("hidden_rel", "layer output error at fitted positions (rel.)")),
                                 strict=True):
        for k in sorted(int(k) for k in rows["k"].dropna().unique()):
            s = rows[(rows["metric"] == name) & (rows["k"] == k)].groupby("layer")["value"].max().sort_index()
            ax.semilogy(s.index, np.maximum(s.to_numpy(), 1e-17), "o-", ms=3, lw=1, label=f"k={k}")
        ax.set_xlabel("layer")
        ax.set_ylabel(label, fontsize=7)
    axes[0, 0].legend(fontsize=6)
    fig.suptitle("per layer, max over prompts", fontsize=8)
    return save_figure(fig, figures_dir, "fit_per_layer")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    if metrics.empty or "method" not in metrics or "top1_match" not in set(metrics["metric"]):
        return []
    paths = _figure_agreement(metrics[metrics["method"].notna()], figures_dir)
    if "layer" in metrics and metrics["layer"].notna().any():
        paths += _figure_layers(metrics, figures_dir)
    return paths
