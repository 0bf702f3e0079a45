"""patch_match — Goldwaser et al. §4–5: Figs. 3–5 on any supported architecture, and Table 1 as a picture.

Setup. A causal LM (Gemma 3, Llama, GPT-2, Mixtral, GPT-J: anything with an adapter in
experiments/patching/arch/) gets each prompt through its chat template and generates greedily. At
every step, every layer is patched (Theorem 1 / Table 1's input and output updates; naive = the
paper's open-loop Algorithm 1, stable = App. B, closed_loop = each layer solved against the patched
pass's own input) so that the model *without any context* — the newest token alone — replaces the
context (prompt and everything generated so far). The patched weights are W + ΔW rounded to the
model's dtype and run by the model's own forward. The two next-token distributions are compared
(L∞ and relative L∞ of the logits, total variation distance, top-1 agreement, per-layer hidden
error); on a top-1 mismatch generation goes on with the baseline's token. Beside them, the control:
the unpatched model without the context. A sweep over models, dtypes and variants gives Table 1 as a
picture (one row per architecture). `gemma_match` is this experiment with Gemma 3's defaults.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, ListConfig

from experiments.core.errors import UserError
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.registry import Experiment
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.patching.arch import VARIANTS

SOURCE = "Goldwaser §4.2"
TABLE1 = "Goldwaser §5 Table 1"
CONTEXT_IMAGE = "context_image.png"  # the image of an image-context run, kept beside its CSVs for Fig. 5
RELATIVE_ROUNDING = 1e-4  # float32 "exact": max |Δlogit| / max |logit| at rounding level
PAPER_BF16_MATCH = {"naive": 87.5, "stable": 98.0}  # % token agreement, TPU bfloat16 (§4.2)
SAMPLING = ("greedy", "sample")
TOKEN_METRICS = ("logit_linf", "logit_linf_rel", "tvd", "top1_match")


# -- config --------------------------------------------------------------------------------------
def prompt_list(cfg: DictConfig) -> list[str]:
    """The Fig. 3 prompt first, then `prompts` (a list, or a text file with one prompt per line)."""
    extra = cfg.get("prompts") or []
    if isinstance(extra, str):
        path = Path(extra).expanduser()
        if not path.is_file():
            raise UserError(f"prompts={extra!r}: no such file (give a list like [a,b] or a file, one prompt a line)")
        extra = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return [str(cfg.prompt), *[str(p) for p in extra]]


def validate(cfg: DictConfig) -> None:
    """Everything checkable before a run folder exists, the model included (`validate_model`)."""
    if cfg.variant not in VARIANTS:
        raise UserError(f"variant={cfg.variant!r} is not one of {', '.join(VARIANTS)}")
    if cfg.sampling not in SAMPLING:
        raise UserError(f"sampling={cfg.sampling!r} is not one of {', '.join(SAMPLING)}")
    require_positive(cfg, "max_new_tokens")
    if float(cfg.temperature) <= 0:
        raise UserError(f"temperature={cfg.temperature} must be positive")
    if not str(cfg.model).strip():
        raise UserError("model= is empty: give a hub id, a local folder, or an offline model such as tiny-gemma3")
    if not isinstance(cfg.get("prompts") or [], (str, list, ListConfig)):
        raise UserError("prompts= must be a list like [a,b] or a path to a text file")
    prompt_list(cfg)
    image = cfg.get("image")
    if image and str(image) != "synthetic" and not Path(str(image)).expanduser().is_file():
        raise UserError(f"image={image!r}: no such file (or use image=synthetic)")
    validate_model(cfg)


def validate_model(cfg: DictConfig) -> None:
    """The model, before any run folder: its config can be had, its architecture has an adapter, the
    variant applies, it fits in memory, an image comes with a vision model."""
    from experiments.core.runtime import resolve_device, resolve_dtype
    from experiments.goldwaser.patch_models import check_model
    from experiments.patching.arch import adapter_for, check_variant

    if cfg.variant not in VARIANTS:
        raise UserError(f"variant={cfg.variant!r} is not one of {', '.join(VARIANTS)}")
    if not str(cfg.model).strip():
        raise UserError("model= is empty: give a hub id, a local folder, or an offline model such as tiny-gemma3")
    image = cfg.get("image")
    config = check_model(str(cfg.model), resolve_dtype(str(cfg.get("dtype", "float32"))),
                         resolve_device(str(cfg.get("device", "auto"))))
    check_variant(adapter_for(config.model_type), str(cfg.variant))
    if image and config.model_type != "gemma3":
        raise UserError(f"image=... needs a multimodal Gemma 3 (e.g. model=google/gemma-3-4b-it or "
                        f"model=tiny-gemma3-vision); {cfg.model} is text-only")


# -- the run -------------------------------------------------------------------------------------
def run(cfg: DictConfig, ctx: RunContext) -> None:
    from experiments.goldwaser.gemma_models import threads_for
    from experiments.goldwaser.patch_models import load_model

    validate(cfg)
    bundle = load_model(cfg.model, ctx.dtype, ctx.device, seed=int(cfg.seed))
    with threads_for(bundle.model):
        compare_all(cfg, ctx, bundle)
    check_claims(ctx, ctx.metrics(), ctx.dtype, cfg.variant, bool(cfg.control), str(cfg.model))


def compare_all(cfg: DictConfig, ctx: RunContext, bundle) -> None:
    """Every prompt: generate with the context and compare with the patched model at every token."""
    import torch

    from experiments.goldwaser.gemma_models import encode_prompt, load_image, stop_token_ids
    from experiments.patching.generate import compare_generation, coupled_sampler, greedy
    from experiments.patching.patcher import Patcher

    image = load_image(cfg.image, int(cfg.seed)) if cfg.get("image") else None
    if image is not None:
        image.save(ctx.path(CONTEXT_IMAGE))
    prompts = prompt_list(cfg)
    patcher = Patcher(bundle.model, cfg.variant)
    choose = greedy if cfg.sampling == "greedy" else coupled_sampler(
        torch.Generator().manual_seed(int(cfg.seed)), float(cfg.temperature))
    stop_ids = stop_token_ids(bundle) if cfg.stop_at_eos else set()
    index = dict(model=str(cfg.model), family=patcher.adapter.family, dtype=dtype_name(ctx.dtype),
                 variant=cfg.variant, device=ctx.device.type, context="image" if image is not None else "text")
    encoded = [encode_prompt(bundle, text, image, bool(cfg.chat_template), ctx.device) for text in prompts]
    check_context_length(bundle.model.config, [e["input_ids"].shape[1] for e in encoded], int(cfg.max_new_tokens))
    with progress(len(prompts) * int(cfg.max_new_tokens), ctx.experiment) as bar:
        for p, inputs in enumerate(encoded):
            steps = matches = 0
            for st in compare_generation(patcher, inputs, int(cfg.max_new_tokens), choose, stop_ids,
                                         bool(cfg.control)):
                log_step(ctx, st, token_text(bundle.tokenizer, st.token_id), prompt=p, **index)
                steps += 1
                matches += st.token_id == st.patched_token_id
                bar.advance(1, info=f"prompt {p + 1}/{len(encoded)}: top-1 match {matches}/{steps}")
            bar.advance(int(cfg.max_new_tokens) - steps)  # a reply that stopped early


def check_context_length(config, prompt_lengths: list[int], max_new_tokens: int) -> None:
    """One line, before any generation, when a prompt plus its reply would run past the model's
    positions (a learned position table, as GPT-2's, has no row for them)."""
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not limit:
        return
    for p, n in enumerate(prompt_lengths):
        if n + max_new_tokens > limit:
            raise UserError(f"prompt {p} is {n} tokens and max_new_tokens={max_new_tokens}: {n + max_new_tokens} "
                            f"positions, the model has {limit}; use a shorter prompt or fewer new tokens")


def token_text(tokenizer, token_id: int) -> str:
    """The token as text; its raw vocabulary entry when it is a fragment of a multi-byte character."""
    text = tokenizer.decode([token_id])
    return str(tokenizer.convert_ids_to_tokens(token_id)) if "\ufffd" in text else text


def log_step(ctx: RunContext, st, token_text: str, **index) -> None:
    from experiments.patching.generate import logit_comparison

    idx = dict(index, step=st.step, token=token_text, token_id=st.token_id)
    ctx.log_many(logit_comparison(st.context, st.patched.logits), **idx)
    ctx.log("token_match", float(st.token_id == st.patched_token_id), **idx)
    if st.control is not None:
        ctrl = logit_comparison(st.context, st.control)
        ctx.log_many({f"control_{k}": ctrl[k] for k in ("logit_linf", "tvd", "top1_match")}, **idx)
        ctx.log("control_ms", st.control_ms, **idx)
    ctx.log_many(dict(div_zero=st.patched.div_zero, no_root=st.patched.no_root, dm_linf=st.patched.dm_linf,
                      routing_changed=st.patched.routing_changed,
                      baseline_ms=st.baseline_ms, patch_ms=st.patch_ms, patched_ms=st.patched_ms), **idx)
    for layer, (err, rel) in enumerate(zip(st.patched.hidden_linf, st.patched.hidden_rel, strict=True)):
        ctx.log("hidden_linf", err, layer=layer, **idx)
        ctx.log("hidden_rel", rel, layer=layer, **idx)


def check_claims(ctx: RunContext, m: pd.DataFrame, dtype, variant: str, control: bool, model: str) -> None:
    """The paper's claims for this run's dtype and variant. Both sides of each are independent: the
    model's own forward with the context against the patched weights' own forward without it."""
    import torch

    name = dtype_name(dtype)
    where = f"{model}, {name}, {variant}"
    match = 100.0 * metric(m, "top1_match")["value"].mean()
    rel = metric(m, "logit_linf_rel")["value"].max()
    if dtype in (torch.float32, torch.float64):
        ctx.check(f"goldwaser.fig3.{variant}_{name}_top1_match", SOURCE + " Fig 3",
                  f"patched model without context picks the same top-1 token as the model with it, "
                  f"every generated token, % ({where})", match, ">=", 100.0, paper_value=100.0)
        ctx.check(f"goldwaser.table1.{variant}_{name}_rounding", TABLE1,
                  f"next-token logits at rounding level: max |Δlogit| / max |logit| over all tokens ({where})",
                  rel, "<=", RELATIVE_ROUNDING)
    elif dtype == torch.bfloat16:
        paper = PAPER_BF16_MATCH.get(variant)
        bar = paper if paper is not None else PAPER_BF16_MATCH["stable"]  # closed loop: the paper's best
        ctx.check(f"goldwaser.fig4.{variant}_bfloat16_top1_match", SOURCE + " Fig 3–4",
                  f"bfloat16 top-1 token agreement, % of generated tokens; the paper measured on TPU with "
                  f"Gemma 3 1B ({where})", match, ">=", bar, paper_value=paper)
    if "routing_changed" in set(m["metric"]) and metric(m, "top1_match")["family"].iloc[0] == "Mixtral" \
            and variant == "closed_loop" and dtype != torch.bfloat16:
        ctx.check("goldwaser.table1.moe_same_experts", TABLE1 + " Thm 11",
                  f"the patched router picks the same experts as with the context: layers x tokens where it "
                  f"did not ({where})", metric(m, "routing_changed")["value"].sum(), "<=", 0.0)
    if control:
        ratio = (metric(m, "control_logit_linf")["value"].median()
                 / max(metric(m, "logit_linf")["value"].median(), 1e-300))
        ctx.check(f"goldwaser.fig3.{variant}_{name}_control_differs", SOURCE + " (control)",
                  f"the control (unpatched model, no context) is far off where the patched one is close: log10 "
                  f"of the median logit L∞ ratio control / patched ({where})", math.log10(ratio), ">=", 1.0)


# -- figures -------------------------------------------------------------------------------------
MAX_SERIES_AS_LINES = 4  # Fig. 3 as the paper draws it (two line plots per series) up to this many series


def _series(m: pd.DataFrame) -> pd.Series:
    label = m["dtype"].astype(str) + " " + m["variant"].astype(str)
    if "model" in m and m["model"].nunique() > 1:
        label = m["model"].astype(str) + " " + label
    return label


def _per_token(m: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, prompt, step): the per-token metrics side by side."""
    keep = m[m["metric"].isin([*TOKEN_METRICS, "control_logit_linf", "control_tvd"])].copy()
    keep["series"] = _series(keep)
    cols = ["series", "run_id", "context", "prompt", "step"]
    wide = keep.pivot_table(index=cols, columns="metric", values="value", aggfunc="first")
    # a token's text may be "" or "nan", which CSV reading turns into NaN: keep it out of the index
    wide["token"] = keep.groupby(cols)["token"].first().fillna("")
    if "token_id" in keep:
        wide["token_id"] = keep.groupby(cols)["token_id"].first()
    return wide.reset_index().sort_values(cols)


def tick_labels(rows: pd.DataFrame) -> list[str]:
    """The generated tokens as text; token ids (#17) when the tokenizer's text is not readable (the byte
    tokenizer of the random models emits control bytes and fragments)."""
    texts = rows["token"].astype(str).tolist()
    ids = rows["token_id"].tolist() if "token_id" in rows else [None] * len(texts)
    readable = all(t.strip() and t.isprintable() and "\ufffd" not in t for t in texts)
    if readable:
        return [t.replace("$", r"\$") for t in texts]
    return [f"#{int(i)}" if i is not None and i == i else "?" for i in ids]


def _figure_per_token(wide: pd.DataFrame, figures_dir: Path, name: str, title: str,
                      image_path: Path | None = None) -> list[Path]:
    """Figs. 3 and 5: per generated token of the first prompt, L∞ of the logit difference (top) and TVD
    (below), a red X where the top-1 tokens differ; one pair of panels per series; the control in grey.
    Fig. 5 shows the context image beside them."""
    from matplotlib.lines import Line2D

    first = wide[wide["prompt"] == wide["prompt"].min()]
    n_prompts = int(wide["prompt"].nunique())
    series = sorted(first["series"].unique())
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
    series = sorted(first["series"].unique())
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
    series = sorted(wide["series"].unique())
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
    bars = ax.bar(range(len(series)), pct, color="tab:blue")
    for b, p, c in zip(bars, pct, counts, strict=True):
        ax.annotate(f"{p:.1f}%\n(n={c})", (b.get_x() + b.get_width() / 2, p), ha="center", va="bottom", fontsize=7)
    for variant, value in PAPER_BF16_MATCH.items():
        ax.axhline(value, color="tab:red" if variant == "naive" else "tab:green", ls=":", lw=1,
                   label=f"paper, bfloat16 {variant}: {value}%")
    ax.legend(loc="lower left", fontsize=6)
    ax.set_xticks(range(len(series)), series, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 115)
    ax.set_ylabel("top-1 token agreement (%)")
    n_gen = wide.groupby(["series", "run_id", "prompt"]).ngroups // max(len(series), 1)
    ax.set_title(f"top-1 agreement over {n_gen} generations per series")
    return save_figure(fig, figures_dir, "fig4_summary")


def table1(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per model × dtype × variant: % top-1 agreement, max relative logit L∞, tokens (Table 1's picture)."""
    top1 = metrics[metrics["metric"] == "top1_match"]
    rel = metrics[metrics["metric"] == "logit_linf_rel"]
    keys = [k for k in ("family", "model", "dtype", "variant") if k in top1 and top1[k].notna().all()]
    out = top1.groupby(keys)["value"].agg(match=lambda v: 100 * v.mean(), tokens="size")
    out["max_rel_linf"] = rel.groupby(keys)["value"].max() if not rel.empty else float("nan")
    return out.reset_index()


def _figure_table1(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """One row per architecture, one column per dtype × variant: token agreement (left) and max relative
    logit L∞ (right), each cell annotated; the paper's bfloat16 numbers in the title."""
    t = table1(metrics)
    t["row"] = (t["family"].astype(str) + " (" + t["model"].astype(str) + ")") if "family" in t else t["model"]
    t["col"] = t["dtype"].astype(str) + "\n" + t["variant"].astype(str)
    rows, cols = sorted(t["row"].unique()), sorted(t["col"].unique())
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
    axes[0, 0].set_title("token agreement per architecture")
    axes[0, 1].set_title("max relative logit L∞")
    fig.suptitle("Table 1 as a picture: patched model without context vs model with context "
                 f"(paper, Gemma 3 1B bfloat16 on TPU: naive {PAPER_BF16_MATCH['naive']}%, "
                 f"stable {PAPER_BF16_MATCH['stable']}%)", fontsize=8)
    return save_figure(fig, figures_dir, "table1_architectures")


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
    return paths


EXPERIMENT = Experiment(
    name="patch_match",
    paper="Goldwaser et al.",
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    run=run,
    plot=plot,
    validate=validate,
    free_form_keys=("prompts",),  # a list of prompts, or a text file with one prompt a line
)
