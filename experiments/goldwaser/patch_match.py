"""patch_match — Goldwaser et al. §4–5: Figs. 3–5 on any supported architecture, and Table 1 as a picture.

Setup. A causal LM (Gemma 3, Llama, GPT-2, Mixtral, GPT-J: anything with an adapter in
experiments/patching/arch/) gets each prompt through its chat template and generates greedily. At
every step, every layer is patched (Theorem 1 / Table 1's input and output updates) so that the model
*without any context* — the newest token alone — replaces the context (prompt and everything generated
so far). The patched weights are W + ΔW rounded to the model's dtype and run by the model's own forward.
The two next-token distributions are compared (L∞ and relative L∞ of the logits, total variation
distance, top-1 agreement, per-layer hidden error against an independent record of the with-context
pass); on a top-1 mismatch generation goes on with the baseline's token. Beside them, the control: the
unpatched model without the context. A sweep over models, dtypes and variants gives Table 1 as a
picture (one row per architecture). `gemma_match` is this experiment with Gemma 3's defaults.

Evidence or construction (patching/variants.py). The open loop (naive = the paper's Algorithm 1, stable =
App. B, conditioned) computes every patch from the with-context pass alone: its agreement tests Theorem 1,
and its claims are the paper's. The closed loop solves each layer for the with-context output itself,
inside the patched pass: exact by design whatever the targets (one layer's patches can force any output),
so its claims are labelled `goldwaser.construction.*` and its control runs beside it, the closed loop at
the last layer alone, which reaches the same logits; what it is measured on is its per-layer error
against the record.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from experiments.core.errors import UserError
from experiments.core.plotting import metric
from experiments.core.progress import progress
from experiments.core.registry import Experiment
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.goldwaser.common import (
    check_context_length,
    describe_model,
    flag_random_weights,
    prompt_list,
    token_text,
    validate_model,
    weights_origin,
)
from experiments.goldwaser.patch_match_plots import CONTEXT_IMAGE, PAPER_BF16_MATCH, plot
from experiments.goldwaser.schema import PatchMatchConfig, Sampling, StockCheck
from experiments.patching.compare import CACHED_ROUNDING, LAYER_EXACT, RECORD_DECADES, rounding_bar
from experiments.patching.kinds import ACTION, ADVANCE_CONTEXT, ADVANCE_PATCHED, MATERIALIZED
from experiments.patching.variants import VARIANTS

log = logging.getLogger(__name__)

SOURCE = "Goldwaser §4.2"
TABLE1 = "Goldwaser §5 Table 1"
CONSTRUCTION = "construction, not evidence for Thm 1"
# where the patched weights are also run as stock weights (Patcher.stock_logits): every token, the first token
# of every prompt, or never; `auto` is every token on a model of at most STOCK_EVERY_TOKEN_PARAMS parameters
# (there the stock pass is small beside the patched one) and the first token otherwise (on Gemma 3 270M it
# costs more than the patched pass itself: it copies the patched tensors in and out and runs the 262k-row
# LM head again)
STOCK_CHECK = {StockCheck.first: lambda step: step == 0, StockCheck.all: lambda step: True,
               StockCheck.none: lambda step: False}
STOCK_EVERY_TOKEN_PARAMS = 50_000_000


# -- config --------------------------------------------------------------------------------------
def validate(cfg: PatchMatchConfig) -> None:
    """Everything checkable before a run folder exists, the model included (`validate_model`). The names
    (variant, apply, advance, sampling, stock_check) are Enums: the schema refuses any other while composing."""
    if cfg.stock_check != StockCheck.auto and VARIANTS[cfg.variant].evidence:
        raise UserError(f"stock_check={cfg.stock_check} is for the closed loop only: variant={cfg.variant}'s "
                        "patched pass already is the model's stock forward of weights computed before it runs")
    require_positive(cfg, "max_new_tokens")
    if cfg.temperature <= 0:
        raise UserError(f"temperature={cfg.temperature} must be positive")
    if not isinstance(cfg.prompts or [], (str, list)):  # `prompts: Any`: a list or a file
        raise UserError("prompts= must be a list like [a,b] or a path to a text file")
    prompt_list(cfg)
    if cfg.image and cfg.image != "synthetic" and not Path(cfg.image).expanduser().is_file():
        raise UserError(f"image={cfg.image!r}: no such file (or use image=synthetic)")
    validate_model(cfg)


# -- the run -------------------------------------------------------------------------------------
def run(cfg: PatchMatchConfig, ctx: RunContext) -> None:
    from experiments.zoo.loading import load_model, model_label
    from experiments.zoo.threads import threads_for

    ctx.model = model_label(cfg.model)
    bundle = load_model(cfg.model, ctx.dtype, ctx.device, seed=cfg.seed)
    with threads_for(bundle.model):
        compare_all(cfg, ctx, bundle)
    check_claims(ctx, ctx.metrics(), ctx.dtype, cfg.variant, cfg.control, cfg.model, cfg.apply, cfg.advance)
    flag_random_weights(ctx, cfg.model)


def compare_all(cfg: PatchMatchConfig, ctx: RunContext, bundle) -> None:
    """Every prompt: generate with the context and compare with the patched model at every token."""
    import torch

    from experiments.core.samples import token_sample
    from experiments.patching.generate import compare_generation, coupled_sampler, greedy
    from experiments.patching.patcher import Patcher
    from experiments.zoo.prompts import encode_prompt, stop_token_ids
    from experiments.zoo.vision import load_image

    image = load_image(cfg.image, cfg.seed) if cfg.image else None
    if image is not None:
        image.save(ctx.path(CONTEXT_IMAGE))
    prompts = prompt_list(cfg)
    patcher = Patcher(bundle.model, cfg.variant, cfg.apply)
    log.info("model %s: %s, %s; %s, variant %s, apply=%s, advance=%s", cfg.model, describe_model(patcher),
             weights_origin(cfg.model), dtype_name(ctx.dtype), cfg.variant, cfg.apply, cfg.advance)
    choose = greedy if cfg.sampling == Sampling.greedy else coupled_sampler(
        torch.Generator().manual_seed(cfg.seed), cfg.temperature)
    stop_ids = stop_token_ids(bundle) if cfg.stop_at_eos else set()
    index = dict(model=cfg.model, family=patcher.adapter.family, dtype=dtype_name(ctx.dtype),
                 variant=cfg.variant, apply=cfg.apply, advance=cfg.advance, device=ctx.device.type,
                 context="image" if image is not None else "text")
    stock_at = STOCK_CHECK[stock_check(cfg.stock_check, bundle.model, cfg.variant)]
    encoded = [encode_prompt(bundle, text, image, cfg.chat_template, ctx.device) for text in prompts]
    check_context_length(bundle.model.config, [e["input_ids"].shape[1] for e in encoded], cfg.max_new_tokens)
    with progress(len(prompts) * cfg.max_new_tokens, ctx.experiment) as bar:
        for p, inputs in enumerate(encoded):
            steps = matches = 0
            for st in compare_generation(patcher, inputs, cfg.max_new_tokens, choose, stop_ids,
                                         cfg.control, stock_at, check_cache=True, advance=cfg.advance):
                log_step(ctx, st, token_text(bundle.tokenizer, st.token_id), prompt=p, **index)
                ctx.sample(token_sample(bundle.tokenizer, st.step, st.context, st.patched.logits,
                                        st.control.logits if st.control is not None else None, st.token_id,
                                        prompt=p, position=inputs["input_ids"].shape[1] + st.step,
                                        **{k: index[k] for k in ("model", "dtype", "variant")}))
                steps += 1
                matches += st.token_id == st.patched_token_id
                bar.advance(1, info=f"prompt {p + 1}/{len(encoded)}: top-1 match {matches}/{steps}")
            bar.advance(cfg.max_new_tokens - steps)  # a reply that stopped early


def stock_check(choice: StockCheck, model, variant: str = "closed_loop") -> StockCheck:
    """`auto`: none for an open loop (its patched pass is the stock forward); for a closed loop every token
    where the stock forward costs little (a small model), the first token otherwise."""
    if choice != StockCheck.auto:
        return choice
    if VARIANTS[variant].evidence:
        return StockCheck.none
    small = sum(p.numel() for p in model.parameters()) <= STOCK_EVERY_TOKEN_PARAMS
    return StockCheck.all if small else StockCheck.first


def log_step(ctx: RunContext, st, token_text: str, **index) -> None:
    from experiments.patching.compare import logit_comparison, top2_margin

    idx = dict(index, step=st.step, token=token_text, token_id=st.token_id)
    ctx.log_many(logit_comparison(st.context, st.patched.logits), **idx)
    ctx.log("context_margin", top2_margin(st.context), **idx)  # how near a tie: where a miss can happen
    ctx.log("token_match", float(st.token_id == st.patched_token_id), **idx)
    if st.control is not None:
        ctrl = logit_comparison(st.context, st.control.logits)
        ctx.log_many({f"control_{k}": ctrl[k] for k in ("logit_linf", "tvd", "top1_match")}, **idx)
        ctx.log("control_ms", st.control_ms, **idx)
    if st.last_layer is not None:
        last = logit_comparison(st.context, st.last_layer.logits)
        ctx.log_many({f"last_layer_{k}": last[k] for k in ("logit_linf", "logit_linf_rel", "top1_match")}, **idx)
    if st.stock is not None:  # against the with-context logits, and against the patched pass's own
        stock = logit_comparison(st.context, st.stock)
        ctx.log_many({f"stock_{k}": stock[k] for k in ("logit_linf_rel", "tvd", "top1_match")}, **idx)
        ctx.log("stock_vs_patched_logit_linf_rel", logit_comparison(st.patched.logits, st.stock)["logit_linf_rel"],
                **idx)
    if st.uncached is not None:  # the record checked against itself: KV-cached against uncached
        ctx.log("cached_vs_uncached_logit_linf_rel", logit_comparison(st.uncached, st.context)["logit_linf_rel"],
                **idx)
    ctx.log_many(dict(div_zero=st.patched.div_zero, no_root=st.patched.no_root, dm_linf=st.patched.dm_linf,
                      routing_changed=st.patched.routing_changed,
                      baseline_ms=st.baseline_ms, patch_ms=st.patch_ms, patched_ms=st.patched_ms), **idx)
    for layer, (err, rel) in enumerate(zip(st.patched.hidden_linf, st.patched.hidden_rel, strict=True)):
        ctx.log("hidden_linf", err, layer=layer, **idx)
        ctx.log("hidden_rel", rel, layer=layer, **idx)
    for name, other in (("control", st.control), ("last_layer", st.last_layer)):
        if other is not None:  # the same distance to the record, for the controls
            for layer, rel in enumerate(other.hidden_rel):
                ctx.log(f"{name}_hidden_rel", rel, layer=layer, **idx)


def run_tag(variant: str, apply: str, advance: str) -> str:
    """The variant, with `_action` (apply=action) and `_own_text` (advance=patched) where they are not the
    defaults: the claims of a sweep over them stay apart, and the defaults' ids stay the paper's."""
    return variant + ("_action" if apply == ACTION else "") + ("_own_text" if advance == ADVANCE_PATCHED else "")


def check_claims(ctx: RunContext, m: pd.DataFrame, dtype, variant: str, control: bool, model: str,
                 apply: str = MATERIALIZED, advance: str = ADVANCE_CONTEXT) -> None:
    """The claims for this run's dtype and variant. Both sides of each are independent: the model's own forward
    with the context against the patched weights' own forward without it, each layer's output against a
    record no solver was handed. An open loop's claims are the paper's; a closed loop's are labelled
    construction, each beside the control that would agree as well if it proved nothing. A claim's id names
    the variant, and the way of applying and advancing where they are not the defaults (`run_tag`)."""
    tag = run_tag(variant, apply, advance)
    if VARIANTS[variant].evidence:
        _evidence_claims(ctx, m, dtype, variant, control, model, tag)
    else:
        _construction_claims(ctx, m, dtype, variant, model, tag)
    if "routing_changed" in set(m["metric"]) and metric(m, "top1_match")["family"].iloc[0] == "Mixtral" \
            and dtype_name(dtype) != "bfloat16":
        kind = "goldwaser.table1" if VARIANTS[variant].evidence else "goldwaser.construction"
        ctx.check(f"{kind}.moe_same_experts_{tag}", TABLE1 + " Thm 11",
                  f"the patched router picks the same experts as with the context: layers x tokens where it "
                  f"did not ({model}, {dtype_name(dtype)}, {tag})", metric(m, "routing_changed")["value"].sum(),
                  "<=", 0.0)
    if "cached_vs_uncached_logit_linf_rel" in set(m["metric"]):
        cached_claim(ctx, m, dtype, model)
    if "stock_vs_patched_logit_linf_rel" in set(m["metric"]) and dtype_name(dtype) != "bfloat16":
        kind = "goldwaser.fig3" if VARIANTS[variant].evidence else "goldwaser.construction"
        ctx.check(f"{kind}.{tag}_{dtype_name(dtype)}_stock_forward", SOURCE + " (a stock forward of the patch)",
                  f"the patched weights written into the model's own parameters and run by its stock forward (no "
                  f"hooks) give the patched pass's logits: max |Δlogit| / max |logit| at the checked tokens "
                  f"({model}, {dtype_name(dtype)}, {tag})",
                  metric(m, "stock_vs_patched_logit_linf_rel")["value"].max(), "<=", rounding_bar(dtype))


def cached_claim(ctx: RunContext, m: pd.DataFrame, dtype, model: str) -> None:
    """The with-context side against itself: at each prompt's last step, the KV-cached logits (the ones every
    patch is judged by) against one uncached forward of the whole sequence. The record and the targets are
    taken in the cached pass, so a bug upstream of them (the cache, the positions, the prompt) is invisible
    to every other claim; this one sees it."""
    name = dtype_name(dtype)
    ctx.check(f"goldwaser.record.{name}_cached_equals_uncached", SOURCE + " (the with-context side)",
              f"the KV-cached with-context logits equal an uncached forward of the prompt and reply so far, at each "
              f"prompt's last step: max |Δlogit| / max |logit| over prompts ({model}, {name})",
              metric(m, "cached_vs_uncached_logit_linf_rel")["value"].max(), "<=", CACHED_ROUNDING[name])


def _evidence_claims(ctx, m, dtype, variant, control, model, tag) -> None:
    name = dtype_name(dtype)
    where = f"{model}, {name}, {tag}"
    match = 100.0 * metric(m, "top1_match")["value"].mean()
    rel = metric(m, "logit_linf_rel")["value"].max()
    if name in ("float32", "float64"):
        ctx.check(f"goldwaser.fig3.{tag}_{name}_top1_match", SOURCE + " Fig 3",
                  f"patched model without context picks the same top-1 token as the model with it, "
                  f"every generated token, % ({where})", match, ">=", 100.0, paper_value=100.0)
        ctx.check(f"goldwaser.table1.{tag}_{name}_rounding", TABLE1,
                  f"next-token logits at rounding level: max |Δlogit| / max |logit| over all tokens ({where})",
                  rel, "<=", rounding_bar(name))
    elif name == "bfloat16":
        paper = PAPER_BF16_MATCH.get(variant)
        bar = paper if paper is not None else PAPER_BF16_MATCH["stable"]  # conditioned: the paper's best
        ctx.check(f"goldwaser.fig4.{tag}_bfloat16_top1_match", SOURCE + " Fig 3–4",
                  f"bfloat16 top-1 token agreement, % of generated tokens; the paper measured on TPU with "
                  f"Gemma 3 1B ({where})", match, ">=", bar, paper_value=paper)
    if control:
        ratio = (metric(m, "control_logit_linf")["value"].median()
                 / max(metric(m, "logit_linf")["value"].median(), 1e-300))
        ctx.check(f"goldwaser.fig3.{tag}_{name}_control_differs", SOURCE + " (control)",
                  f"the control (unpatched model, no context) is far off where the patched one is close: log10 "
                  f"of the median logit L∞ ratio control / patched ({where})", math.log10(ratio), ">=", 1.0)


def _construction_claims(ctx, m, dtype, variant, model, tag) -> None:
    """A closed loop: its logit agreement beside its last-layer control's (which agrees as well: that is why
    neither is evidence), and what can tell them apart, the per-layer error against the record."""
    name = dtype_name(dtype)
    where = f"{model}, {name}, {tag}"
    if name == "bfloat16":
        ctx.check(f"goldwaser.construction.{tag}_bfloat16_top1_match", f"{SOURCE} ({CONSTRUCTION})",
                  f"closed loop, solved for the with-context output at every layer: top-1 agreement, % of generated "
                  f"tokens; agreement by design ({where})", 100.0 * metric(m, "top1_match")["value"].mean(), ">=",
                  PAPER_BF16_MATCH["stable"])
        if "last_layer_top1_match" in set(m["metric"]):
            ctx.check(f"goldwaser.construction.{tag}_bfloat16_last_layer_control_top1",
                      f"{SOURCE} ({CONSTRUCTION})",
                      f"its control, the closed loop at the last layer alone, agrees as well: top-1 agreement, % "
                      f"({where})", 100.0 * metric(m, "last_layer_top1_match")["value"].mean(), ">=",
                      PAPER_BF16_MATCH["stable"])
    else:
        ctx.check(f"goldwaser.construction.{tag}_{name}_logits", f"{TABLE1} ({CONSTRUCTION})",
                  f"closed loop: next-token logits at rounding level, max |Δlogit| / max |logit|; exact by design, "
                  f"since each layer is solved for the with-context output ({where})",
                  metric(m, "logit_linf_rel")["value"].max(), "<=", rounding_bar(name))
        if "last_layer_logit_linf_rel" in set(m["metric"]):
            ctx.check(f"goldwaser.construction.{tag}_{name}_last_layer_control_logits",
                      f"{TABLE1} ({CONSTRUCTION})",
                      f"its control, the closed loop at the last layer alone (every other layer unpatched), reaches "
                      f"the with-context logits as well: max |Δlogit| / max |logit| ({where})",
                      metric(m, "last_layer_logit_linf_rel")["value"].max(), "<=", rounding_bar(name))
    if "last_layer_hidden_rel" not in set(m["metric"]):
        return
    ctx.check(f"goldwaser.construction.{tag}_{name}_every_layer", f"{TABLE1} ({CONSTRUCTION})",
              f"closed loop: every layer's output against the independent record of the with-context pass, max "
              f"relative error over layers and tokens ({where})", metric(m, "hidden_rel")["value"].max(), "<=",
              LAYER_EXACT[name])
    last = metric(m, "last_layer_hidden_rel")
    last = last[last["layer"] < last["layer"].max()]  # the layers it leaves unpatched
    ratio = last["value"].median() / max(metric(m, "hidden_rel")["value"].max(), 1e-300)
    ctx.check(f"goldwaser.construction.{tag}_{name}_every_layer_control", f"{TABLE1} ({CONSTRUCTION})",
              f"what tells the closed loop from its control: log10 of the control's median per-layer error against "
              f"the record (layers before the last) over the closed loop's largest ({where})",
              math.log10(max(ratio, 1e-300)), ">=", RECORD_DECADES[name], measure="log10(control / closed loop)")


EXPERIMENT = Experiment(
    name="patch_match",
    paper="Goldwaser et al.",
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    run=run,
    plot=plot,
    validate=validate,
)
