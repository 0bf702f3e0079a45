"""patch_match's figures (Goldwaser et al. Figs. 3–5 and Table 1 as a picture), drawn from metrics.csv alone.

The open loop (the paper's method) comes first; a closed loop, a construction, is drawn apart and marked so,
beside its control (the closed loop at the last layer alone), which agrees as well; the paper's numbers are
drawn over the open loop's only."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.core.plotting import new_figure, save_figure
from experiments.goldwaser.paper import PAPER_BF16_MATCH, algorithm1_bf16_match
from experiments.patching.variants import VARIANTS

CONTEXT_IMAGE = "context_image.png"  # the image of an image-context run, kept beside its CSVs for Fig. 5
TOKEN_METRICS = ("logit_linf", "logit_linf_rel", "tvd", "top1_match")


MAX_SERIES_AS_LINES = 4  # Fig. 3 as the paper draws it (two line plots per series) up to this many series


def _algorithm1(variant: str) -> bool:
    """The paper's Algorithm 1 (drawn first), as the registry declares it."""
    return variant in VARIANTS and VARIANTS[variant].paper_algorithm


def construction(variant: str) -> bool:
    """A closed loop (or its control): agreement by design, drawn apart from the paper's open loop."""
    name = str(variant).split(":")[0]
    return name in VARIANTS and not VARIANTS[name].evidence


# patch_match's keys beside the variant (how the patch is applied, which token the text follows), their defaults
WAYS = {"apply": "materialized", "advance": "context"}
WAY_WORDS = {("apply", "action"): "action", ("advance", "patched"): "own-text"}


def _ways(m: pd.DataFrame) -> pd.Series:
    """" action own-text" and the like: a run's non-default ways, "" for the defaults (and older runs)."""
    words = pd.Series("", index=m.index)
    for key in WAYS:
        if key in m:
            words += m[key].map(lambda v, key=key: f" {WAY_WORDS[key, v]}" if (key, v) in WAY_WORDS else "")
    return words


def _series(m: pd.DataFrame) -> pd.Series:
    marks = m["variant"].map(lambda v: " (construction)" if construction(v) else "")
    label = m["dtype"].astype(str) + _ways(m) + " " + m["variant"].astype(str) + marks
    if "model" in m and m["model"].nunique() > 1:
        label = m["model"].astype(str) + " " + label
    return label


def _ordered(series: pd.Series) -> list[str]:
    """The series labels, the paper's open loop first and constructions after; within each, by model and
    dtype, then the variants in the registry's order (Algorithm 1, App. B, conditioned, ...)."""
    order = list(VARIANTS)

    def key(label: str):
        words = label.replace(" (construction)", "").split(":")[0].split()
        rank = order.index(words[-1]) if words and words[-1] in order else len(order)
        return "(construction)" in label, " ".join(words[:-1]), rank, label

    return sorted(series.unique(), key=key)


def _per_token(m: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, prompt, step): the per-token metrics side by side."""
    keep = m[m["metric"].isin([*TOKEN_METRICS, "control_logit_linf", "control_tvd", "last_layer_logit_linf"])].copy()
    keep["series"] = _series(keep)
    cols = ["series", "run_id", "context", "prompt", "step"]
    wide = keep.pivot_table(index=cols, columns="metric", values="value", aggfunc="first")
    # a token's text may be "" or "nan", which CSV reading turns into NaN: keep it out of the index
    wide["token"] = keep.groupby(cols)["token"].first().fillna("")
    if "token_id" in keep:
        wide["token_id"] = keep.groupby(cols)["token_id"].first()
    return wide.reset_index().sort_values(cols)


def tick_labels(rows: pd.DataFrame) -> list[str]:
    """The generated tokens as text, whitespace made visible (a newline as ↵, a leading space as ␣); a
    token whose text is not readable (a control byte, a fragment of a multi-byte character: the byte
    tokenizer of the random models emits many) as its id, #17, on its own."""
    texts = rows["token"].astype(str).tolist()
    ids = rows["token_id"].tolist() if "token_id" in rows else [None] * len(texts)
    return [_token_label(t, i) for t, i in zip(texts, ids, strict=True)]


def _token_label(text: str, token_id) -> str:
    shown = text.replace("\n", "↵").replace("\t", "⇥")
    shown = "␣" + shown[1:] if shown.startswith(" ") else shown
    if shown.strip() and shown.isprintable() and "\ufffd" not in shown:
        return shown.replace("$", r"\$")  # matplotlib reads $...$ as mathtext
    return f"#{int(token_id)}" if token_id is not None and token_id == token_id else "?"


def _figure_per_token(wide: pd.DataFrame, figures_dir: Path, name: str, title: str,
                      image_path: Path | None = None) -> list[Path]:
    """Figs. 3 and 5: per generated token of the first prompt, L∞ of the logit difference (top) and TVD
    (below), a red X where the top-1 tokens differ; one pair of panels per series; the control in grey.
    Fig. 5 shows the context image beside them."""
    from matplotlib.lines import Line2D

    first = wide[wide["prompt"] == wide["prompt"].min()]
    n_prompts = int(wide["prompt"].nunique())
    series = _ordered(first["series"])
    n_tok = int(first.groupby(["series", "run_id"]).size().max())
    fig, axes = new_figure(1, 2 * len(series), width=max(6.0, 0.13 * n_tok), height=1.7, sharex=False)
    floor = 1e-12
    for i, s in enumerate(series):
        rows = first[first["series"] == s]
        rows = rows[rows["run_id"] == rows["run_id"].iloc[0]]
        x = rows["step"].to_numpy()
        for k, (col, label) in enumerate((("logit_linf", "logit L∞"), ("tvd", "TVD"))):
            ax = axes[2 * i + k, 0]
            ax.semilogy(x, np.maximum(rows[col].to_numpy(), floor), "o-", ms=2.5, lw=1)
            if f"control_{col}" in rows:
                ax.semilogy(x, np.maximum(rows[f"control_{col}"].to_numpy(), floor), "--", color="0.6", lw=1)
            bad = rows["top1_match"].to_numpy() < 0.5
            if bad.any():
                ax.plot(x[bad], np.maximum(rows[col].to_numpy()[bad], floor), "x", color="red", ms=7, mew=2)
            ax.set_ylabel(label)
            ax.set_title(f"{s}" if k == 0 else "", loc="left")
            ax.set_xticks(x)
            ax.set_xticklabels(tick_labels(rows) if k == 1 else [], rotation=90, fontsize=6)
    handles = [Line2D([], [], marker="o", ms=3, lw=1, label="patched, no context"),
               Line2D([], [], ls="--", color="0.6", lw=1, label="control: unpatched, no context"),
               Line2D([], [], marker="x", ls="", color="red", ms=7, mew=2, label="top-1 differs")]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=6)
    axes[-1, 0].set_xlabel("generated token")
    shown = "the only prompt" if n_prompts == 1 else f"prompt 0 of {n_prompts} (all {n_prompts} in Fig. 4)"
    fig.suptitle(f"{title}; {shown}", fontsize=9)
    if image_path is not None and image_path.is_file():
        import matplotlib.image as mpimg

        inset = fig.add_axes([0.005, 0.80, 0.1, 0.17])
        inset.imshow(mpimg.imread(image_path))
        inset.set_title("context image", fontsize=6)
        inset.axis("off")
    return save_figure(fig, figures_dir, name)


def _figure_per_token_grid(wide: pd.DataFrame, figures_dir: Path, name: str, title: str) -> list[Path]:
    """Fig. 3 for a sweep's many series: one heatmap row per series (its first prompt and run), one
    column per generated token, colour log10 of the logit L∞ (top) and of the TVD (below), a red X
    where the top-1 tokens differ; each row's label carries its control's median logit L∞. Two panels
    of a few inches instead of two plots per series (a 20-job sweep drew a 70-inch-tall figure)."""
    first = wide[wide["prompt"] == wide["prompt"].min()]
    series = _ordered(first["series"])
    n_tok = int(first.groupby(["series", "run_id"]).size().max())
    grids = {col: np.full((len(series), n_tok), np.nan) for col in ("logit_linf", "tvd")}
    bad = np.zeros((len(series), n_tok), dtype=bool)
    labels = []
    for i, s in enumerate(series):
        rows = first[first["series"] == s]
        rows = rows[rows["run_id"] == rows["run_id"].iloc[0]]
        steps = rows["step"].to_numpy().astype(int)
        for col, grid in grids.items():
            grid[i, steps] = np.log10(np.maximum(rows[col].to_numpy(), 1e-12))
        bad[i, steps] = rows["top1_match"].to_numpy() < 0.5
        control = rows["control_logit_linf"].median() if "control_logit_linf" in rows else float("nan")
        labels.append(s if math.isnan(control) else f"{s} (control {control:.2g})")
    fig, axes = new_figure(1, 2, width=max(6.0, 0.12 * n_tok + 3.5), height=0.14 * len(series) + 0.9)
    ys, xs = np.nonzero(bad)
    for ax, (col, label) in zip(axes[:, 0], (("logit_linf", "log10 logit L∞"), ("tvd", "log10 TVD")), strict=True):
        im = ax.imshow(grids[col], aspect="auto", cmap="viridis", interpolation="nearest")
        ax.plot(xs, ys, "x", color="red", ms=4, mew=1.2, label="top-1 differs")
        ax.set_yticks(range(len(series)), labels, fontsize=6)
        ax.grid(False)
        fig.colorbar(im, ax=ax, fraction=0.03).set_label(label, fontsize=7)
        if xs.size:
            ax.legend(loc="upper right", fontsize=6)
    axes[-1, 0].set_xlabel("generated token")
    n_prompts = int(wide["prompt"].nunique())
    shown = "the only prompt" if n_prompts == 1 else f"prompt 0 of {n_prompts} (all {n_prompts} in Fig. 4)"
    fig.suptitle(f"{title}; {shown}; row label: the control's (unpatched, no context) median logit L∞",
                 fontsize=8)
    return save_figure(fig, figures_dir, name)


def _figure_summary(wide: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """Fig. 4: over all generated tokens of all prompts, the distribution of the logit L∞ per series
    beside its own control, and the top-1 agreement in % with the paper's bfloat16 numbers marked."""
    series = _ordered(wide["series"])
    # two panels side by side for a few series, stacked for a sweep's many
    wide_layout = len(series) > 3
    fig, axes = new_figure(1, 2, width=min(24.0, 0.45 * 2 * len(series) + 3), height=3.4) if wide_layout \
        else new_figure(2, 1, width=max(3.6, 1.4 * len(series) + 1.5), height=3.2)
    axes = axes.reshape(1, 2)
    ax = axes[0, 0]
    data, labels, colors = [], [], []
    for s in series:
        rows = wide[wide["series"] == s]
        data.append(np.maximum(rows["logit_linf"].to_numpy(), 1e-12))
        labels.append(s)
        colors.append("tab:blue")
        if "control_logit_linf" in rows and rows["control_logit_linf"].notna().any():
            data.append(rows["control_logit_linf"].dropna().to_numpy())
            labels.append(f"{s}: control")
            colors.append("0.6")
        if "last_layer_logit_linf" in rows and rows["last_layer_logit_linf"].notna().any():  # a construction's own
            data.append(np.maximum(rows["last_layer_logit_linf"].dropna().to_numpy(), 1e-12))
            labels.append(f"{s}: last layer alone")
            colors.append("tab:purple")
    boxes = ax.boxplot(data, whis=(0, 100), patch_artist=True)
    for patch, color in zip(boxes["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_alpha(0.5)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("logit L∞ per token")
    ax.set_title("logit difference (whiskers: min–max)")
    ax = axes[0, 1]
    pct = [100 * wide.loc[wide["series"] == s, "top1_match"].mean() for s in series]
    counts = [int((wide["series"] == s).sum()) for s in series]
    bars = ax.bar(range(len(series)), pct, color=["0.75" if "(construction)" in s else "tab:blue" for s in series],
                  hatch=None)
    for b, s in zip(bars, series, strict=True):
        if "(construction)" in s:
            b.set_hatch("//")
    for b, p, c in zip(bars, pct, counts, strict=True):
        ax.annotate(f"{p:.1f}%\n(n={c})", (b.get_x() + b.get_width() / 2, p), ha="center", va="bottom", fontsize=7)
    for i, s in enumerate(series):  # the paper's numbers over the bars they compare with (bfloat16 only)
        value = _paper_bf16(s)
        if value is not None:
            ax.hlines(value, i - 0.45, i + 0.45, color="tab:red", ls="--", lw=1.5,
                      label="paper (Gemma 3 1B, TPU bfloat16)")
    if ax.get_legend_handles_labels()[0]:
        handles, names = ax.get_legend_handles_labels()
        ax.legend(handles[:1], names[:1], loc="upper left", bbox_to_anchor=(0, -0.32 if not wide_layout else -0.45),
                  fontsize=6, frameon=False)
    ax.set_xticks(range(len(series)), series, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 115)
    ax.set_ylabel("top-1 token agreement (%)")
    n_gen = wide.groupby(["series", "run_id", "prompt"]).ngroups // max(len(series), 1)
    ax.set_title(f"top-1 agreement over {n_gen} generations per series"
                 + ("\n(hatched: construction, exact by design)" if any("(construction)" in s for s in series) else ""))
    return save_figure(fig, figures_dir, "fig4_summary")


def _paper_bf16(series: str) -> float | None:
    """The paper's bfloat16 agreement for a series label ("... bfloat16 [action] naive"), None for others."""
    words = series.split()
    return PAPER_BF16_MATCH.get(words[-1]) if len(words) >= 2 and "bfloat16" in words[:-1] else None


def table1(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per model × dtype × variant: % top-1 agreement, max relative logit L∞, tokens (Table 1's picture); a
    closed loop's last-layer control as a variant of its own ("closed_loop: last layer alone")."""
    parts = []
    for prefix, suffix in (("", ""), ("last_layer_", ": last layer alone")):
        top1 = metrics[metrics["metric"] == f"{prefix}top1_match"]
        rel = metrics[metrics["metric"] == f"{prefix}logit_linf_rel"]
        if top1.empty:
            continue
        keys = [k for k in ("family", "model", "dtype", "variant", *WAYS) if k in top1 and top1[k].notna().all()]
        out = top1.groupby(keys)["value"].agg(match=lambda v: 100 * v.mean(), tokens="size")
        out["max_rel_linf"] = rel.groupby(keys)["value"].max() if not rel.empty else float("nan")
        out = out.reset_index()
        out["variant"] = out["variant"].astype(str) + suffix
        parts.append(out)
    return pd.concat(parts, ignore_index=True)


def _figure_table1(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """One row per architecture, one column per dtype × variant: token agreement (left) and max relative
    logit L∞ (right), each cell annotated; the paper's bfloat16 numbers in the title."""
    t = table1(metrics)
    t["row"] = (t["family"].astype(str) + " (" + t["model"].astype(str) + ")") if "family" in t else t["model"]
    t["col"] = t["dtype"].astype(str) + _ways(t) + "\n" + t["variant"].astype(str).str.replace(": ", ":\n")
    t["built"] = t["variant"].map(construction)
    rows = sorted(t["row"].unique())
    cols = [c for _, c in sorted({(bool(b), c) for b, c in zip(t["built"], t["col"], strict=True)})]  # open first
    fig, axes = new_figure(2, 1, width=max(3.4, 1.0 * len(cols) + 1.8), height=max(2.2, 0.45 * len(rows) + 1.4))
    panels = (("match", "top-1 token agreement (%)", "RdYlGn", (0, 100), "{:.1f}%"),
              ("max_rel_linf", "log10 max |Δlogit| / max |logit|", "viridis", None, "{:.1e}"))
    for ax, (col, label, cmap, lim, fmt) in zip(axes[0], panels, strict=True):
        grid = t.pivot_table(index="row", columns="col", values=col, aggfunc="first").reindex(index=rows, columns=cols)
        shown = grid.to_numpy(dtype=float)
        if col == "max_rel_linf":
            shown = np.log10(np.maximum(shown, 1e-12))
        im = ax.imshow(shown, cmap=cmap, aspect="auto", vmin=lim[0] if lim else None, vmax=lim[1] if lim else None)
        for i in range(len(rows)):
            for j in range(len(cols)):
                value = grid.to_numpy()[i, j]
                if not (isinstance(value, float) and math.isnan(value)):
                    dark = col == "max_rel_linf" and shown[i, j] < np.nanmean(shown)  # viridis is dark low
                    ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        ax.set_xticks(range(len(cols)), cols, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.grid(False)
        fig.colorbar(im, ax=ax, fraction=0.05).set_label(label, fontsize=7)
    n_open = int((~t.drop_duplicates("col")["built"]).sum())
    if 0 < n_open < len(cols):  # the constructions apart, right of a line
        for ax in axes[0]:
            ax.axvline(n_open - 0.5, color="k", lw=2)
    apart = ("\nright of the line: the closed loop, a construction (exact by design),\nand its control, the "
             "last layer alone, which agrees as well" if n_open < len(cols) else "")
    axes[0, 0].set_title("token agreement per architecture" + apart, fontsize=8)
    axes[0, 1].set_title("max relative logit L∞", fontsize=8)
    fig.suptitle("Table 1 as a picture: patched model without context vs model with context "
                 f"(paper, Gemma 3 1B bfloat16 on TPU: "
                 f"{', '.join(f'{name} {value}%' for name, value in PAPER_BF16_MATCH.items())})", fontsize=8)
    return save_figure(fig, figures_dir, "table1_architectures")


def ways_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per model × dtype × variant × apply × advance: top-1 matches of tokens with the 95 % Wilson interval
    of the rate, the largest relative logit L∞, the median TVD and the largest per-layer hidden error (any
    layer, any token: an open loop's is the witness's against its uncached with-context forward, a closed
    loop's the pass's against the record): the rows of docs/goldwaser.md's bfloat16 table."""
    from experiments.core.intervals import wilson

    top1 = metrics[metrics["metric"] == "top1_match"]
    keys = [k for k in ("model", "dtype", "variant", *WAYS) if k in top1 and top1[k].notna().all()]
    out = top1.groupby(keys)["value"].agg(matches="sum", tokens="size").reset_index()
    out["matches"] = out["matches"].astype(int)
    out["top1_pct"] = 100.0 * out["matches"] / out["tokens"]
    bounds = [wilson(k, n) for k, n in zip(out["matches"], out["tokens"], strict=True)]
    out["top1_lo_pct"], out["top1_hi_pct"] = ([100.0 * b[i] for b in bounds] for i in (0, 1))
    for name, metric_name, how in (("max_rel_linf", "logit_linf_rel", "max"), ("median_tvd", "tvd", "median"),
                                   ("max_hidden_rel", "hidden_rel", "max")):
        rows = metrics[metrics["metric"] == metric_name]
        if metric_name == "hidden_rel":  # where a witness judged the run, its per-layer errors
            witness = metrics[metrics["metric"] == "witness_hidden_rel"]
            judged = set(witness.groupby(keys).groups) if len(witness) else set()
            rows = pd.concat([witness, rows[[k not in judged for k in rows[keys].itertuples(index=False)]]])
        out = out.merge(rows.groupby(keys)["value"].agg(how).rename(name).reset_index(), on=keys, how="left")
    margin = metrics[metrics["metric"] == "context_margin"]
    if not margin.empty:  # how near a tie the with-context top-1 was: over every token, and at the misses
        steps = [*keys, "run_id", "prompt", "step"]  # run_id alone repeats across sweeps ("bf16-0")
        joined = margin.merge(top1[[*steps, "value"]].rename(columns={"value": "hit"}), on=steps)
        out = out.merge(joined.groupby(keys)["value"].median().rename("median_margin").reset_index(), on=keys,
                        how="left")
        missed = joined[joined["hit"] < 1].groupby(keys)["value"].max().rename("max_margin_at_misses")
        out = out.merge(missed.reset_index(), on=keys, how="left")
    return out


def ways_figure(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """Top-1 agreement per way of applying the patch and of advancing the text, one panel per model: a bar per
    dtype, its 95 % Wilson interval, the paper's bfloat16 number (Gemma 3 1B on TPU) as a line."""
    t = ways_table(metrics)
    for key, default in WAYS.items():
        t[key] = t[key] if key in t else default
    t["case"] = t["variant"].astype(str) + "\n" + t["apply"].astype(str) + "\n" + t["advance"].astype(str)
    models = sorted(t["model"].unique())
    dtypes = [d for d in ("float64", "float32", "bfloat16") if d in set(t["dtype"])]
    most = int(t.groupby("model")["case"].nunique().max())
    fig, axes = new_figure(1, len(models), width=max(4.0, 0.95 * most + 2.0), height=2.6)  # a row per model
    width = 0.8 / max(len(dtypes), 1)
    alg1, alg1_match = algorithm1_bf16_match()
    for ax, model in zip(axes[:, 0], models, strict=True):
        rows = t[t["model"] == model]
        first = rows.drop_duplicates("case").set_index("case")
        cases = sorted(first.index, key=lambda c: (not _algorithm1(first.at[c, "variant"]), first.at[c, "variant"],
                                                   first.at[c, "apply"] != WAYS["apply"],
                                                   first.at[c, "advance"] != WAYS["advance"]))
        for i, dtype in enumerate(dtypes):
            d = rows[rows["dtype"] == dtype].set_index("case").reindex(cases)
            x = np.arange(len(cases)) + (i - (len(dtypes) - 1) / 2) * width
            err = np.vstack([d["top1_pct"] - d["top1_lo_pct"], d["top1_hi_pct"] - d["top1_pct"]])
            ax.bar(x, d["top1_pct"], width, yerr=err, capsize=2, label=dtype)
        ax.axhline(alg1_match, color="k", ls="--", lw=1, label=f"paper, bfloat16 {alg1} ({alg1_match}%)")
        ax.set_xticks(range(len(cases)), cases, fontsize=7)
        ax.set_ylim(0, 105)
        ax.set_ylabel("top-1 token agreement (%)")
        ax.set_title(f"{model}: variant / apply / advance", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("where bfloat16's gap comes from: W + ΔW written (materialized) or applied as an action,\nthe text "
                 "following the model with the context or the patched model's own tokens (95 % Wilson intervals)",
                 fontsize=8)
    return save_figure(fig, figures_dir, "bf16_ways")


def _several_ways(metrics: pd.DataFrame) -> bool:
    return any(key in metrics and metrics[key].nunique() > 1 for key in WAYS)


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    if metrics.empty or "top1_match" not in set(metrics["metric"]):
        return []
    wide = _per_token(metrics)
    paths = []
    text, image = wide[wide["context"] == "text"], wide[wide["context"] == "image"]
    if not text.empty:
        draw = _figure_per_token if text["series"].nunique() <= MAX_SERIES_AS_LINES else _figure_per_token_grid
        paths += draw(text, figures_dir, "fig3_per_token",
                      "patched model without context vs model with context (text prompt)")
        paths += _figure_summary(text, figures_dir)
    if not image.empty:
        paths += _figure_per_token(image, figures_dir, "fig5_image_context",
                                   "patched model without context vs model with context (image in the context)",
                                   image_path=Path(figures_dir).parent / CONTEXT_IMAGE)
    if len(table1(metrics)) > 1:
        paths += _figure_table1(metrics, figures_dir)
    if _several_ways(metrics):
        paths += ways_figure(metrics, figures_dir)
    return paths


