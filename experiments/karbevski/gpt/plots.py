"""gpt_wq's figures, from metrics.csv alone (a single job, or a `-m variant=...` sweep combined):
Fig. 1 (validation loss against steps, one curve per variant, the paper's 100k-step values marked) and
Table 2 (a CSV and a rendered table: parameters, MLP multiplier, scale, weight decay, final validation
loss beside the paper's, and the paper's comparisons as measured)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.core.atomic import write_atomic
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.karbevski.gpt.comparisons import paper_comparisons
from experiments.karbevski.gpt.variants import VARIANTS

PAPER_STEPS = 100_000


def _per_variant(metrics: pd.DataFrame, name: str) -> dict[str, float]:
    rows = metrics[metrics["metric"] == name]
    return {v: float(g["value"].iloc[-1]) for v, g in rows.groupby("variant")}


def table2(metrics: pd.DataFrame) -> pd.DataFrame:
    final = _per_variant(metrics, "final_val_loss")
    cols = {k: _per_variant(metrics, k) for k in ("params_total", "params_non_embedding", "params_total_paper_shape",
                                                  "params_non_embedding_paper_shape", "d_model", "head_dim",
                                                  "attn_scale", "weight_decay")}
    rows = []
    for name, v in VARIANTS.items():
        if name not in cols["params_total"]:
            continue
        rows.append({"variant": name, "label": v.label, "trainable_wq": v.query == "learned",
                     "params_total_m": cols["params_total"][name] / 1e6,
                     "params_non_embedding_m": cols["params_non_embedding"][name] / 1e6,
                     "paper_shape_params_total_m": cols["params_total_paper_shape"][name] / 1e6,
                     "paper_params_total_m": v.paper_total_m,
                     "paper_shape_params_non_embedding_m": cols["params_non_embedding_paper_shape"][name] / 1e6,
                     "paper_params_non_embedding_m": v.paper_non_embedding_m,
                     "mlp_mult": v.mlp_mult, "d_model": int(cols["d_model"][name]),
                     "head_dim": int(cols["head_dim"][name]),
                     "attn_scale": cols["attn_scale"][name], "weight_decay": cols["weight_decay"].get(name),
                     "final_val_loss": final.get(name), "paper_val_loss": v.paper_val_loss})
    return pd.DataFrame(rows)


def loss_unit(metrics: pd.DataFrame) -> str:
    """What one step of the loss is over: `byte` for the byte-level tokenizer, `GPT-2 token` for GPT-2's BPE (the
    paper's), `token` for a run that did not say (written before the tokenizer was logged) or mixes both."""
    said = set(metric(metrics, "final_val_loss").get("tokenizer", pd.Series(dtype=object)).dropna())
    return {frozenset({"bytes"}): "byte", frozenset({"gpt2"}): "GPT-2 token"}.get(frozenset(said), "token")


def _fig1(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    val = metric(metrics, "val_loss")
    fig, axes = new_figure(2, width=4.4, height=3.3)
    ax, ax_delta = axes[0]
    last_step = 0
    for i, (name, v) in enumerate(VARIANTS.items()):
        curve = val[val["variant"] == name].sort_values("step")
        if curve.empty:
            continue
        last_step = max(last_step, int(curve["step"].max()))
        ax.plot(curve["step"], curve["value"], color=f"C{i}", lw=1.3, label=v.label)
    if last_step >= PAPER_STEPS / 2:  # the paper's final values are on this x range: mark them
        for i, v in enumerate(VARIANTS.values()):
            ax.plot([PAPER_STEPS], [v.paper_val_loss], marker="*", ms=9, color=f"C{i}", ls="none",
                    label="paper, 100k steps" if i == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"validation loss (nats / {loss_unit(metrics)})")
    ax.set_title("Fig. 1: validation loss during training")
    ax.legend(loc="upper right")
    # right: final loss relative to the 124M baseline, measured beside the paper's (same units at any preset)
    final = _per_variant(metrics, "final_val_loss")
    names = [n for n in VARIANTS if n in final]
    x = range(len(names))
    paper_base = VARIANTS["baseline_124m"].paper_val_loss
    ax_delta.bar([i - 0.2 for i in x], [VARIANTS[n].paper_val_loss - paper_base for n in names], width=0.4,
                 color="0.7", label="paper (100k steps)")
    if "baseline_124m" in final:
        ax_delta.bar([i + 0.2 for i in x], [final[n] - final["baseline_124m"] for n in names], width=0.4,
                     color=[f"C{list(VARIANTS).index(n)}" for n in names], label="measured (this run)")
    ax_delta.axhline(0, color="k", lw=0.8)
    ax_delta.set_xticks(list(x), [VARIANTS[n].label for n in names], rotation=30, ha="right")
    ax_delta.set_ylabel("final val. loss − baseline (124M)")
    ax_delta.set_title("final validation loss vs the 124M baseline")
    ax_delta.legend()
    return save_figure(fig, figures_dir, "fig1_val_loss")


def _table_figure(table: pd.DataFrame, figures_dir: Path) -> list[Path]:
    def fmt(x, spec):
        return "—" if x is None or pd.isna(x) else format(x, spec)

    rows = {
        "Trainable W_Q": ["✓" if t else "×" for t in table["trainable_wq"]],
        "Total params (paper shape)": [f"{a:.2f}M ({b:.2f}M)" for a, b in
                                       zip(table["paper_shape_params_total_m"], table["paper_params_total_m"],
                                           strict=True)],
        "Non-emb params (paper shape)": [f"{a:.2f}M ({b:.2f}M)" for a, b in
                                         zip(table["paper_shape_params_non_embedding_m"],
                                             table["paper_params_non_embedding_m"], strict=True)],
        "Params trained here": [f"{a:.3g}M" for a in table["params_total_m"]],
        "d_model / d_k here": [f"{d} / {k}" for d, k in zip(table["d_model"], table["head_dim"], strict=True)],
        "MLP hid. mult.": [f"{m:g}×" for m in table["mlp_mult"]],
        "Attention scale": [f"{s:.4g}" for s in table["attn_scale"]],
        "Weight decay": [fmt(w, ".4g") for w in table["weight_decay"]],
        "Val loss, this run": [fmt(v, ".3f") for v in table["final_val_loss"]],
        "Val loss, paper (100k)": [f"{v:.3f}" for v in table["paper_val_loss"]],
    }
    fig, axes = new_figure(1, width=11.5, height=0.3 * (len(rows) + 2))
    ax = axes[0][0]
    ax.axis("off")
    t = ax.table(cellText=list(rows.values()), rowLabels=list(rows), colLabels=list(table["label"]), loc="center",
                 cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(8)
    t.scale(1, 1.3)
    ax.set_title("Table 2: configurations and validation loss (parentheses: the paper's counts)")
    return save_figure(fig, figures_dir, "table2")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    figures_dir = Path(figures_dir)
    if "variant" not in metrics.columns or metric(metrics, "params_total").empty:
        return []
    table = table2(metrics)
    write_atomic(figures_dir / "table2.csv", lambda p: table.to_csv(p, index=False))
    final = _per_variant(metrics, "final_val_loss")
    comparisons = pd.DataFrame(paper_comparisons(final))
    if not comparisons.empty:
        comparisons["passed"] = [(m <= t) if c == "<=" else (m >= t) for m, c, t in
                                 zip(comparisons["measured"], comparisons["comparison"], comparisons["tolerance"],
                                     strict=True)]
        write_atomic(figures_dir / "table2_comparisons.csv", lambda p: comparisons.to_csv(p, index=False))
    paths = [figures_dir / "table2.csv"]
    if not metric(metrics, "val_loss").empty:
        paths += _fig1(metrics, figures_dir)
    return paths + _table_figure(table, figures_dir)
