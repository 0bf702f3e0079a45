"""layer_errors' figure, from metrics.csv alone: per layer, the patched pass's relative hidden error (one panel
per dtype, one line per variant: the median over tokens, the band min–max), the patched layer's gain over
the original layer's, and the output update's size max |Δm|."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from experiments.core.plotting import new_figure, save_figure
from experiments.patching.variants import Style, in_registry_order, label, style

# each variant's colour, marker, width and legend entry are its own (patching/variants.py: `style`, `label`); a
# variant the registry does not know is drawn in the default style under its own name, never dropped
CONTROL = ("control: unpatched, no context", Style("0.55", "", 1.0))  # the unpatched model: no variant
STYLE = {"float32": "--", "float64": "-"}
FLOOR = 1e-20  # exact zeros on a log axis


def _by_layer(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.groupby("layer")["value"].agg(["median", "min", "max"]).reset_index()


def _band(ax, rows: pd.DataFrame, look: Style, ls: str, label: str) -> None:
    s = _by_layer(rows)
    x = s["layer"].to_numpy()
    color, marker, lw = look
    ax.semilogy(x, np.maximum(s["median"].to_numpy(), FLOOR), ls, color=color, marker=marker, ms=3.5, lw=lw,
                label=label)
    ax.fill_between(x, np.maximum(s["min"].to_numpy(), FLOOR), np.maximum(s["max"].to_numpy(), FLOOR),
                    color=color, alpha=0.15, lw=0)


def _gain_ratio(m: pd.DataFrame) -> pd.DataFrame:
    keys = ["dtype", "variant", "prompt", "token", "layer"]
    p = m[m["metric"] == "gain_patched"].set_index(keys)["value"]
    o = m[m["metric"] == "gain_original"].set_index(keys)["value"]
    return (p / o).rename("value").dropna().reset_index()


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    m = metrics
    if m.empty or "hidden_rel" not in set(m["metric"]):
        return []
    dtypes = [d for d in ("float32", "float64") if d in set(m["dtype"])]
    variants = in_registry_order(m["variant"].dropna())
    control = m[m["metric"] == "control_hidden_rel"]
    fig, axes = new_figure(len(dtypes) + 2, 1, width=3.5, height=3.2)
    axes = axes[0]
    err = m[m["metric"] == "hidden_rel"]
    for ax, dtype in zip(axes, dtypes, strict=False):
        for v in variants:
            _band(ax, err[(err["dtype"] == dtype) & (err["variant"] == v)], style(v), STYLE[dtype], label(v))
        ctrl = control[(control["dtype"] == dtype) & (control["variant"] == variants[0])] if variants else control
        if not ctrl.empty:  # the same unpatched pass for every variant: drawn once
            _band(ax, ctrl, CONTROL[1], STYLE[dtype], CONTROL[0])
        ax.axhline(np.finfo(np.dtype(dtype)).eps, color="0.5", ls=":", lw=1, label=f"{dtype} machine ε")
        ax.axhline(1.0, color="0.3", lw=0.8)
        ax.set_title(f"{dtype}: each layer's output against the\nindependent record of the with-context pass")
        ax.set_xlabel("layer")
        ax.set_ylabel("max |x′ − x| / max |x|")
        ax.legend(fontsize=6, loc="center right")  # the control sits near 1, the closed loop at rounding level
    ratio = _gain_ratio(m)
    ax = axes[len(dtypes)]
    for v in variants:
        for dtype in dtypes:
            rows = ratio[(ratio["dtype"] == dtype) & (ratio["variant"] == v)]
            if not rows.empty:
                _band(ax, rows, style(v), STYLE[dtype], f"{v}, {dtype}")
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_title("gain of the patched layer / original layer\n(same x, same random δ)")
    ax.set_xlabel("layer")
    ax.set_ylabel("‖T′(x+δ) − T′(x)‖ / ‖T(x+δ) − T(x)‖")
    _legend_or_say(ax, "no gain measured for these variants")
    ax = axes[len(dtypes) + 1]
    dm = m[(m["metric"] == "dm_linf") & (m["dtype"] == dtypes[-1])]
    for v in variants:
        _band(ax, dm[dm["variant"] == v], style(v), STYLE[dtypes[-1]], label(v))
    ax.set_title(f"largest entry of the output update, {dtypes[-1]}")
    ax.set_xlabel("layer")
    ax.set_ylabel("max |Δ| of the output parameter (Δm)")
    _legend_or_say(ax, "no output update measured for these variants")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    model = m["model"].iloc[0] if "model" in m else "?"
    preset = m["preset"].iloc[0] if "preset" in m and m["preset"].notna().any() else "?"
    n_tok = err.groupby(["prompt", "token"]).ngroups
    fig.suptitle(f"layer_errors: {model}, preset={preset}; the query alone through the patched model vs with its "
                 f"context, {n_tok} tokens\n(line: median, band: min–max; naive and the closed loop with Thm 10 alone "
                 f"compute the same Δm, so their gains coincide)", fontsize=9)
    return save_figure(fig, figures_dir, "fig_layer_errors")


def _legend_or_say(ax, empty: str) -> None:
    """The panel's legend, or where nothing was measured (a closed loop alone has no gain), a line that says so
    instead of an empty frame."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="upper left")
    else:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.4")
