"""gemma_match — Goldwaser et al. §4, Figs. 3–5.

Setup. An instruction-tuned Gemma 3 (1B by default; 4B multimodal with an image for Fig. 5) gets
the prompt "Write a single-sentence weather forecast for Mars, from the perspective of a slightly
annoyed robot." through its chat template and generates greedily. At every step, Algorithm 1 patches
every layer (Theorem 1: rank-1 ΔW_gate, ΔW_up and Δm; or App. B's stable update with ΔW_down) so
that the model *without any context* — the newest token alone — replaces the context (prompt and
everything generated so far). The patched weights are W + ΔW rounded to the model's dtype and run
by a genuine forward. The two next-token distributions are compared (L∞ of the logits, total
variation distance, top-1 agreement); on a top-1 mismatch generation goes on with the baseline's
token. Beside them, the control: the unpatched model without the context. Over many prompts the
same numbers give Fig. 4.
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
from experiments.patching.gemma3 import VARIANTS

SOURCE = "Goldwaser §4.2"
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
    if cfg.variant not in VARIANTS:
        raise UserError(f"variant={cfg.variant!r} is not one of {', '.join(VARIANTS)}")
    if cfg.sampling not in SAMPLING:
        raise UserError(f"sampling={cfg.sampling!r} is not one of {', '.join(SAMPLING)}")
    require_positive(cfg, "max_new_tokens")
    if float(cfg.temperature) <= 0:
        raise UserError(f"temperature={cfg.temperature} must be positive")
    if not str(cfg.model).strip():
        raise UserError("model= is empty: give a hub id, a local folder, or tiny-gemma3")
    if not isinstance(cfg.get("prompts") or [], (str, list, ListConfig)):
        raise UserError("prompts= must be a list like [a,b] or a path to a text file")
    prompt_list(cfg)
    image = cfg.get("image")
    if image and str(image) != "synthetic" and not Path(str(image)).expanduser().is_file():
        raise UserError(f"image={image!r}: no such file (or use image=synthetic)")


# -- the run -------------------------------------------------------------------------------------
def run(cfg: DictConfig, ctx: RunContext) -> None:
    from experiments.goldwaser.gemma_models import load_gemma, threads_for

    validate(cfg)
    bundle = load_gemma(cfg.model, ctx.dtype, ctx.device, seed=int(cfg.seed))
    with threads_for(bundle.model):
        compare_all(cfg, ctx, bundle)
    check_claims(ctx, ctx.metrics(), ctx.dtype, cfg.variant, bool(cfg.control))


def compare_all(cfg: DictConfig, ctx: RunContext, bundle) -> None:
    """Every prompt: generate with the context and compare with the patched model at every token."""
    import torch

    from experiments.goldwaser.gemma_models import encode_prompt, load_image, stop_token_ids
    from experiments.patching.gemma3_generate import GemmaPatcher, compare_generation, coupled_sampler, greedy

    image = load_image(cfg.image, int(cfg.seed)) if cfg.get("image") else None
    prompts = prompt_list(cfg)
    patcher = GemmaPatcher(bundle.model, cfg.variant)
    choose = greedy if cfg.sampling == "greedy" else coupled_sampler(
        torch.Generator().manual_seed(int(cfg.seed)), float(cfg.temperature))
    stop_ids = stop_token_ids(bundle) if cfg.stop_at_eos else set()
    index = dict(model=str(cfg.model), dtype=dtype_name(ctx.dtype), variant=cfg.variant,
                 device=ctx.device.type, context="image" if image is not None else "text")
    with progress(len(prompts) * int(cfg.max_new_tokens), "gemma_match") as bar:
        for p, text in enumerate(prompts):
            inputs = encode_prompt(bundle, text, image, bool(cfg.chat_template), ctx.device)
            steps = 0
            for st in compare_generation(patcher, inputs, int(cfg.max_new_tokens), choose, stop_ids,
                                         bool(cfg.control)):
                log_step(ctx, st, token_text(bundle.tokenizer, st.token_id), prompt=p, **index)
                steps += 1
                bar.advance(1, info=f"prompt {p}: top-1 {'=' if st.token_id == st.patched_token_id else '≠'}")
            bar.advance(int(cfg.max_new_tokens) - steps)  # a reply that stopped early


def token_text(tokenizer, token_id: int) -> str:
    """The token as text; its raw vocabulary entry when it is a fragment of a multi-byte character."""
    text = tokenizer.decode([token_id])
    return str(tokenizer.convert_ids_to_tokens(token_id)) if "\ufffd" in text else text


def log_step(ctx: RunContext, st, token_text: str, **index) -> None:
    from experiments.patching.gemma3_generate import logit_comparison

    idx = dict(index, step=st.step, token=token_text, token_id=st.token_id)
    ctx.log_many(logit_comparison(st.context, st.patched.logits), **idx)
    ctx.log("token_match", float(st.token_id == st.patched_token_id), **idx)
    if st.control is not None:
        ctrl = logit_comparison(st.context, st.control)
        ctx.log_many({f"control_{k}": ctrl[k] for k in ("logit_linf", "tvd", "top1_match")}, **idx)
        ctx.log("control_ms", st.control_ms, **idx)
    ctx.log_many(dict(div_zero=st.patched.div_zero, no_root=st.patched.no_root, dm_linf=st.patched.dm_linf,
                      baseline_ms=st.baseline_ms, patch_ms=st.patch_ms, patched_ms=st.patched_ms), **idx)
    for layer, (err, rel) in enumerate(zip(st.patched.hidden_linf, st.patched.hidden_rel, strict=True)):
        ctx.log("hidden_linf", err, layer=layer, **idx)
        ctx.log("hidden_rel", rel, layer=layer, **idx)


def check_claims(ctx: RunContext, m: pd.DataFrame, dtype, variant: str, control: bool) -> None:
    import torch

    name = dtype_name(dtype)
    where = f"{name}, {variant}, measured on {ctx.device.type}"
    match = 100.0 * metric(m, "top1_match")["value"].mean()
    n = len(metric(m, "top1_match"))
    if dtype in (torch.float32, torch.float64):
        ctx.claim_at_least(f"patched model without context picks the same top-1 token ({where}; % of {n})",
                           SOURCE + " Fig 3", "100%", match, 100.0)
        rel = metric(m, "logit_linf_rel")["value"].max()
        tol = 1000 * torch.finfo(torch.float32).eps  # Gemma's RMSNorm computes in float32 whatever the dtype
        ctx.claim_at_most(f"logit L∞ at rounding level: max |Δlogit| / max |logit| ({where}; "
                          f"tolerance 1000 float32 eps = {tol:.1e})", SOURCE + " Fig 3", "≈0", rel, tol)
    elif dtype == torch.bfloat16:
        paper = PAPER_BF16_MATCH[variant]
        ctx.claim_at_least(f"bfloat16 {variant} token agreement, % of {n} ({where}; paper on TPU: {paper}%)",
                           SOURCE + " Fig 3–4", f"{paper}%", match, paper)
    if control:
        ratio = (metric(m, "control_logit_linf")["value"].median()
                 / max(metric(m, "logit_linf")["value"].median(), 1e-300))
        ctx.claim_at_least(f"the control (unpatched, no context) is far off: log10 of median L∞ ratio "
                           f"control / patched ({where})", SOURCE + " (control)", "n/a", math.log10(ratio), 1.0)


# -- figures -------------------------------------------------------------------------------------
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
    return wide.reset_index().sort_values(cols)


def _figure_per_token(wide: pd.DataFrame, figures_dir: Path, name: str, title: str) -> list[Path]:
    """Figs. 3 and 5: per generated token, L∞ of the logit difference (top) and TVD (below), a red X
    where the top-1 tokens differ; one pair of panels per dtype/variant; the control in grey."""
    first = wide[wide["prompt"] == wide["prompt"].min()]
    series = sorted(first["series"].unique())
    n_tok = int(first.groupby(["series", "run_id"]).size().max())
    fig, axes = new_figure(1, 2 * len(series), width=max(6.0, 0.13 * n_tok), height=1.7, sharex=False)
    for i, s in enumerate(series):
        rows = first[first["series"] == s]
        rows = rows[rows["run_id"] == rows["run_id"].iloc[0]]
        x = rows["step"].to_numpy()
        for k, (col, label) in enumerate((("logit_linf", "logit L∞"), ("tvd", "TVD"))):
            ax = axes[2 * i + k, 0]
            floor = 1e-12
            ax.semilogy(x, np.maximum(rows[col].to_numpy(), floor), "o-", ms=2.5, lw=1, label="patched, no context")
            if f"control_{col}" in rows:
                ax.semilogy(x, np.maximum(rows[f"control_{col}"].to_numpy(), floor), "--", color="0.6", lw=1,
                            label="control: unpatched, no context")
            bad = rows["top1_match"].to_numpy() < 0.5
            if bad.any():
                ax.plot(x[bad], np.maximum(rows[col].to_numpy()[bad], floor), "x", color="red", ms=7, mew=2,
                        label="top-1 differs")
            ax.set_ylabel(label)
            ax.set_title(f"{s}" if k == 0 else "", loc="left")
            ax.set_xticks(x)
            ax.set_xticklabels([repr(t)[1:-1] for t in rows["token"].astype(str)] if k == 1 else [],
                               rotation=90, fontsize=6)
            if i == 0 and k == 0:
                ax.legend(loc="upper right", fontsize=6)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, figures_dir, name)


def _figure_summary(wide: pd.DataFrame, figures_dir: Path) -> list[Path]:
    """Fig. 4: over all generated tokens of all prompts, the distribution of the logit L∞ per
    dtype/variant (with the control's), and the top-1 agreement in %."""
    series = sorted(wide["series"].unique())
    fig, axes = new_figure(2, 1, width=max(3.6, 1.1 * len(series) + 1.5), height=3.2)
    ax = axes[0, 0]
    data = [np.maximum(wide.loc[wide["series"] == s, "logit_linf"].to_numpy(), 1e-12) for s in series]
    labels = list(series)
    if "control_logit_linf" in wide:
        data.append(wide["control_logit_linf"].dropna().to_numpy())
        labels.append("control")
    ax.boxplot(data, whis=(0, 100))
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("logit L∞ per token")
    ax.set_title("logit difference")
    ax = axes[0, 1]
    pct = [100 * wide.loc[wide["series"] == s, "top1_match"].mean() for s in series]
    counts = [int((wide["series"] == s).sum()) for s in series]
    bars = ax.bar(range(len(series)), pct, color="tab:blue")
    for b, p, c in zip(bars, pct, counts, strict=True):
        ax.annotate(f"{p:.1f}%\n(n={c})", (b.get_x() + b.get_width() / 2, p), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(series)), series, rotation=30, ha="right")
    ax.set_ylim(0, 115)
    ax.set_ylabel("top-1 token agreement (%)")
    n_gen = wide.groupby(["series", "run_id", "prompt"]).ngroups // max(len(series), 1)
    ax.set_title(f"top-1 agreement over {n_gen} generations per series")
    return save_figure(fig, figures_dir, "fig4_summary")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    if metrics.empty or "top1_match" not in set(metrics["metric"]):
        return []
    wide = _per_token(metrics)
    paths = []
    text, image = wide[wide["context"] == "text"], wide[wide["context"] == "image"]
    if not text.empty:
        paths += _figure_per_token(text, figures_dir, "fig3_per_token",
                                   "patched model without context vs model with context (text prompt)")
        paths += _figure_summary(text, figures_dir)
    if not image.empty:
        paths += _figure_per_token(image, figures_dir, "fig5_image_context",
                                   "patched model without context vs model with context (image in the context)")
    return paths


EXPERIMENT = Experiment(
    name="gemma_match",
    paper="Goldwaser et al.",
    figures="Figs. 3–5",
    description="Gemma 3 without context, patched per token (Thm 1, Alg. 1, App. B), vs with context",
    run=run,
    plot=plot,
    validate=validate,
    free_form_keys=("prompts",),  # a list of prompts, or a text file with one prompt a line
)
