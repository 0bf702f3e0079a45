"""The left and middle panels that Figs. 2, 5 and 6 of Dherin et al. share: train loss with the
validation loss computed both ways (with context, via the patch) and the control, then a close-up
of the two validation losses. Drawn from tidy metrics with a `config` column (one series each)."""

from __future__ import annotations

import pandas as pd

from experiments.core.plotting import mean_sem, metric

SERIES = {
    "train_loss": ("train loss", dict(color="0.6", lw=0.6, alpha=0.7)),
    "val_loss_context": ("validation loss (with context)", dict(color="C0", lw=1.6)),
    "val_loss_patched": ("validation loss (computed via ΔW)", dict(color="C1", lw=1.2, ls="--")),
    "val_loss_no_context": ("control: unpatched, no context", dict(color="C3", lw=1.0, ls=":")),
}


def _bars(rows: pd.DataFrame) -> str:
    """What the error bars are: the s.e.m. over runs (seeds) of a sweep, or nothing for a single run."""
    n = rows["run_id"].nunique() if "run_id" in rows else 1
    return f"\n(mean ± s.e.m. over n = {n} runs)" if n > 1 else " (one run: no error bar)"


def draw_loss_panels(ax_loss, ax_close, metrics: pd.DataFrame) -> None:
    """Fig. 2/5/6 left and middle from a frame with a `config` column: train loss, the validation loss
    with context and via ΔW (and the control), then a close-up of the two validation losses."""
    configs = sorted(metrics["config"].unique())
    for ci, config in enumerate(configs):
        sub = metrics[metrics["config"] == config]
        suffix = f" [{config}]" if len(configs) > 1 else ""
        for name, (label, style) in SERIES.items():
            s = metric(sub, name)
            if s.empty:
                continue
            if name == "train_loss":  # a running mean keeps the noisy per-step loss readable
                s = s.sort_values("step")
                s = s.assign(value=s.groupby("run_id")["value"].transform(lambda v: v.rolling(25, 1).mean()))
            agg = mean_sem(s, "step")
            ax_loss.plot(agg["step"], agg["mean"], label=label + suffix, **style)
            if name in ("val_loss_context", "val_loss_patched"):
                patched = name.endswith("patched")
                ax_close.errorbar(agg["step"], agg["mean"], yerr=agg["sem"], label=label + suffix + _bars(s),
                                  marker="x" if patched else "o", ms=3.5, ls=style.get("ls", "-"),
                                  color=f"C{2 * ci + patched}", lw=1, capsize=0)
        zero = metric(sub, "val_loss_zero_predictor")
        if not zero.empty and ci == 0:
            ax_loss.axhline(zero["value"].mean(), color="k", lw=0.6, ls="-.", label="zero predictor")
    ax_loss.set(yscale="log", xlabel="training step", ylabel="loss", title="Train and validation loss")
    ax_loss.legend(loc="center right", fontsize=6.5)  # the curves run along the top and the bottom
    close = metrics[metrics["metric"].isin(["val_loss_context", "val_loss_patched"])]
    if not close.empty:
        last = close["step"].max()
        late = close[close["step"] >= last * 0.3]
        lo, hi = late["value"].min(), late["value"].max()
        # at least 2 % of the loss tall: two equal values (one checkpoint) would give a range of 1e-14 and
        # tick labels like "1e-14+9.99e-1"
        pad = max(0.05 * (hi - lo), 0.01 * abs(hi), 1e-12)
        ax_close.set_ylim(lo - pad, hi + pad)
        ax_close.yaxis.get_major_formatter().set_useOffset(False)
        if last > 0:
            ax_close.set_xlim(last * 0.3, last * 1.02)
        else:  # only the checkpoint at step 0 (an interrupted run)
            ax_close.set_xlim(-1, 1)
    gap = metrics[metrics["metric"] == "val_max_abs_diff"]["value"].max()
    ax_close.set(xlabel="training step", ylabel="validation loss",
                 title=f"Close-up: with context vs via ΔW\n(max |ŷ_ctx − ŷ_ΔW| = {gap:.1e})")
    # below the axes: the two curves fill the close-up, and any place inside it would cover them
    ax_close.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=7, frameon=False)
