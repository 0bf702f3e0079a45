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

import logging
import math
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, ListConfig

from experiments.core.errors import UserError
from experiments.core.plotting import metric
from experiments.core.progress import progress
from experiments.core.registry import Experiment
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.goldwaser.patch_match_plots import CONTEXT_IMAGE, PAPER_BF16_MATCH, plot
from experiments.patching.arch import CLOSED_LOOP, VARIANTS

log = logging.getLogger(__name__)

SOURCE = "Goldwaser §4.2"
TABLE1 = "Goldwaser §5 Table 1"
RELATIVE_ROUNDING = 1e-4  # float32 "exact": max |Δlogit| / max |logit| at rounding level
SAMPLING = ("greedy", "sample")
# where the patched weights are also run as stock weights (Patcher.stock_logits): the first token of every
# prompt (default: one extra forward a prompt), every token, or never
STOCK_CHECK = {"first": lambda step: step == 0, "all": lambda step: True, "none": lambda step: False}


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
    if str(cfg.get("stock_check", "first")) not in STOCK_CHECK:
        raise UserError(f"stock_check={cfg.stock_check!r} is not one of {', '.join(STOCK_CHECK)}")
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
    from experiments.patching.arch import adapter_for, check_variant
    from experiments.zoo.loading import check_model

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
    from experiments.zoo.loading import load_model
    from experiments.zoo.threads import threads_for

    bundle = load_model(cfg.model, ctx.dtype, ctx.device, seed=int(cfg.seed))
    with threads_for(bundle.model):
        compare_all(cfg, ctx, bundle)
    check_claims(ctx, ctx.metrics(), ctx.dtype, cfg.variant, bool(cfg.control), str(cfg.model))
    flag_random_weights(ctx, str(cfg.model))


def compare_all(cfg: DictConfig, ctx: RunContext, bundle) -> None:
    """Every prompt: generate with the context and compare with the patched model at every token."""
    import torch

    from experiments.patching.generate import compare_generation, coupled_sampler, greedy
    from experiments.patching.patcher import Patcher
    from experiments.zoo.prompts import encode_prompt, stop_token_ids
    from experiments.zoo.vision import load_image

    image = load_image(cfg.image, int(cfg.seed)) if cfg.get("image") else None
    if image is not None:
        image.save(ctx.path(CONTEXT_IMAGE))
    prompts = prompt_list(cfg)
    patcher = Patcher(bundle.model, cfg.variant)
    log.info("model %s: %s, %s; %s, variant %s", cfg.model, describe_model(patcher), weights_origin(str(cfg.model)),
             dtype_name(ctx.dtype), cfg.variant)
    choose = greedy if cfg.sampling == "greedy" else coupled_sampler(
        torch.Generator().manual_seed(int(cfg.seed)), float(cfg.temperature))
    stop_ids = stop_token_ids(bundle) if cfg.stop_at_eos else set()
    index = dict(model=str(cfg.model), family=patcher.adapter.family, dtype=dtype_name(ctx.dtype),
                 variant=cfg.variant, device=ctx.device.type, context="image" if image is not None else "text")
    stock_at = STOCK_CHECK[str(cfg.get("stock_check", "first"))]
    encoded = [encode_prompt(bundle, text, image, bool(cfg.chat_template), ctx.device) for text in prompts]
    check_context_length(bundle.model.config, [e["input_ids"].shape[1] for e in encoded], int(cfg.max_new_tokens))
    with progress(len(prompts) * int(cfg.max_new_tokens), ctx.experiment) as bar:
        for p, inputs in enumerate(encoded):
            steps = matches = 0
            for st in compare_generation(patcher, inputs, int(cfg.max_new_tokens), choose, stop_ids,
                                         bool(cfg.control), stock_at):
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
    if st.stock is not None:
        stock = logit_comparison(st.context, st.stock)
        ctx.log_many({f"stock_{k}": stock[k] for k in ("logit_linf_rel", "tvd", "top1_match")}, **idx)
    ctx.log_many(dict(div_zero=st.patched.div_zero, no_root=st.patched.no_root, dm_linf=st.patched.dm_linf,
                      routing_changed=st.patched.routing_changed,
                      baseline_ms=st.baseline_ms, patch_ms=st.patch_ms, patched_ms=st.patched_ms), **idx)
    for layer, (err, rel) in enumerate(zip(st.patched.hidden_linf, st.patched.hidden_rel, strict=True)):
        ctx.log("hidden_linf", err, layer=layer, **idx)
        ctx.log("hidden_rel", rel, layer=layer, **idx)


def weights_origin(model: str) -> str:
    """Where the weights come from, for the console: a failed claim reads differently on random weights."""
    from experiments.zoo.loading import OFFLINE_MODELS, REAL_OFFLINE_MODELS

    if model in OFFLINE_MODELS:
        return "random weights (offline)"
    if model in REAL_OFFLINE_MODELS:
        return "trained weights (offline, from the package registry)"
    return "weights from the hub" if not Path(model).expanduser().exists() else "weights from a local folder"


def describe_model(patcher) -> str:
    """`Gemma 3, 4 layers, d=64`: the family and the size of what ran."""
    config = patcher.text_config
    return f"{patcher.adapter.family}, {config.num_hidden_layers} layers, d={config.hidden_size}"


def flag_random_weights(ctx: RunContext, model: str) -> None:
    """The goldwaser claims state what the paper measured on a trained Gemma 3: on an offline model with
    random weights a failure describes those weights (e.g. the open loop's amplification), not the paper.
    Said after the claims, with the way to trained weights."""
    from experiments.zoo.loading import OFFLINE_MODELS

    claims = ctx.claims()
    failed = claims.loc[~claims["passed"].astype(bool), "id"].tolist() if len(claims) else []
    if model in OFFLINE_MODELS and failed:
        ctx.notes.append(f"model={model} has random weights: the claims state what the paper measured on a trained "
                         f"Gemma 3, so {', '.join(failed)} failing here describes these random weights, as it may by "
                         "design; model=gemma-3-270m runs a trained Gemma 3 offline")


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
    if "stock_top1_match" in set(m["metric"]) and variant in CLOSED_LOOP and dtype != torch.bfloat16:
        ctx.check(f"goldwaser.fig3.{variant}_{name}_stock_forward", SOURCE + " (a stock forward of the patch)",
                  f"the patched weights written into the model's own parameters and run by its stock forward (no "
                  f"hooks) give the with-context logits too: max |Δlogit| / max |logit| at the checked tokens "
                  f"({where})", metric(m, "stock_logit_linf_rel")["value"].max(), "<=", RELATIVE_ROUNDING)
    if control:
        ratio = (metric(m, "control_logit_linf")["value"].median()
                 / max(metric(m, "logit_linf")["value"].median(), 1e-300))
        ctx.check(f"goldwaser.fig3.{variant}_{name}_control_differs", SOURCE + " (control)",
                  f"the control (unpatched model, no context) is far off where the patched one is close: log10 "
                  f"of the median logit L∞ ratio control / patched ({where})", math.log10(ratio), ">=", 1.0)


EXPERIMENT = Experiment(
    name="patch_match",
    paper="Goldwaser et al.",
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    run=run,
    plot=plot,
    validate=validate,
)
