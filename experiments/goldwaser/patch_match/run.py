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
from pathlib import Path

from experiments.core.errors import UserError
from experiments.core.progress import progress
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
from experiments.goldwaser.patch_match import PatchMatchConfig, Sampling, StockCheck
from experiments.goldwaser.patch_match.claims import check_claims
from experiments.goldwaser.patch_match.plots import CONTEXT_IMAGE
from experiments.patching.variants import VARIANTS

log = logging.getLogger(__name__)

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
    prompts = prompt_list(cfg)
    if cfg.image and cfg.image != "synthetic" and not Path(cfg.image).expanduser().is_file():
        raise UserError(f"image={cfg.image!r}: no such file (or use image=synthetic)")
    validate_model(cfg, prompts, cfg.max_new_tokens)


# -- the run -------------------------------------------------------------------------------------
def run(cfg: PatchMatchConfig, ctx: RunContext) -> None:
    from experiments.patching.load import load_checked, model_label
    from experiments.zoo.threads import threads_for

    ctx.model = model_label(cfg.model)
    bundle = load_checked(cfg.model, ctx.dtype, ctx.device, seed=cfg.seed)
    with threads_for(bundle.model):
        adapter = compare_all(cfg, ctx, bundle)
    check_claims(ctx, ctx.metrics(), ctx.dtype, cfg.variant, cfg.control, cfg.model, cfg.apply, cfg.advance,
                 routed=adapter.rule.routed_experts)
    flag_random_weights(ctx, cfg.model)


def compare_all(cfg: PatchMatchConfig, ctx: RunContext, bundle):
    """Every prompt: generate with the context and compare with the patched model at every token. Returns the
    adapter that patched it: what its claims ask of the block (an MoE's routing) is its rule's to say."""
    import torch

    from experiments.core.samples import token_sample
    from experiments.patching.generate import compare_generation, coupled_sampler, greedy, reference_for
    from experiments.patching.patcher import Patcher
    from experiments.patching.witness import Witness
    from experiments.zoo.prompts import encode_prompt, stop_token_ids
    from experiments.zoo.vision import load_image

    image = load_image(cfg.image, cfg.seed) if cfg.image else None
    if image is not None:
        image.save(ctx.path(CONTEXT_IMAGE))
    prompts = prompt_list(cfg)
    patcher = Patcher(bundle.model, cfg.variant, cfg.apply, batch_layers="auto")  # layers at once on a GPU
    witness = Witness(bundle.model, patcher.adapter.layers, patcher.logit_dtype)
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
            steps = []
            for st in compare_generation(patcher, inputs, cfg.max_new_tokens, choose, stop_ids,
                                         cfg.control, stock_at, advance=cfg.advance, witness=witness):
                text = token_text(bundle.tokenizer, st.token_id)
                log_step(ctx, st, text, prompt=p, **index)
                ctx.sample(token_sample(bundle.tokenizer, st.step, st.context, st.patched.logits,
                                        st.control.logits if st.control is not None else None, st.token_id,
                                        prompt=p, position=inputs["input_ids"].shape[1] + st.step,
                                        **{k: index[k] for k in ("model", "dtype", "variant")}))
                steps.append((st, text))
                matches = sum(s.token_id == s.patched_token_id for s, _ in steps)
                bar.advance(1, info=f"prompt {p + 1}/{len(encoded)}: top-1 match {matches}/{len(steps)}")
            reference = reference_for(witness, inputs, [st for st, _ in steps])
            for st, text in steps:
                log_judged(ctx, st, reference, text, prompt=p, **index)
            bar.advance(cfg.max_new_tokens - len(steps))  # a reply that stopped early
    return patcher.adapter


def stock_check(choice: StockCheck, model, variant: str) -> StockCheck:
    """`auto`: none for an open loop (its patched pass is the stock forward); for a closed loop every token
    where the stock forward costs little (a small model), the first token otherwise."""
    if choice != StockCheck.auto:
        return choice
    if VARIANTS[variant].evidence:
        return StockCheck.none
    small = sum(p.numel() for p in model.parameters()) <= STOCK_EVERY_TOKEN_PARAMS
    return StockCheck.all if small else StockCheck.first


def log_step(ctx: RunContext, st, token_text: str, **index) -> None:
    """What a step says on its own: how near a tie, the generation's choice, the stock check, the instrumented
    pass's statistics, its per-layer distance to the record and its difference to the witness, the timers."""
    from experiments.patching.compare import logit_comparison, top2_margin

    idx = dict(index, step=st.step, token=token_text, token_id=st.token_id)
    ctx.log("context_margin", top2_margin(st.context), **idx)  # how near a tie: where a miss can happen
    ctx.log("token_match", float(st.token_id == st.patched_token_id), **idx)
    if st.stock is not None:  # the patched weights' stock forward against the patched pass's own logits
        ctx.log("stock_vs_patched_logit_linf_rel", logit_comparison(st.patched.logits, st.stock)["logit_linf_rel"],
                **idx)
    if st.witness is not None:  # the instrumented pass against the witness: 0 when they agree bit for bit
        ctx.log("witness_vs_instrumented_linf", st.witness_diff, **idx)
    ctx.log_many(dict(div_zero=st.patched.div_zero, no_root=st.patched.no_root, dm_linf=st.patched.dm_linf,
                      routing_changed=st.patched.routing_changed,
                      baseline_ms=st.baseline_ms, patch_ms=st.patch_ms, patched_ms=st.patched_ms), **idx)
    if st.control is not None:
        ctx.log("control_ms", st.control_ms, **idx)
    for layer, (err, rel) in enumerate(zip(st.patched.hidden_linf, st.patched.hidden_rel, strict=True)):
        ctx.log("hidden_linf", err, layer=layer, **idx)
        ctx.log("hidden_rel", rel, layer=layer, **idx)
    for name, other in (("control", st.control), ("last_layer", st.last_layer)):
        if other is not None:  # the same distance to the record, for the controls
            for layer, rel in enumerate(other.hidden_rel):
                ctx.log(f"{name}_hidden_rel", rel, layer=layer, **idx)


def log_judged(ctx: RunContext, st, reference, token_text: str, **index) -> None:
    """A step judged against the witness's reference (the uncached with-context forward, witness.py): the
    patched logits (the witness's own forward of the patched tensors for an open loop; the pass's for a closed
    loop, a construction), the controls', the KV-cached with-context logits, and each layer's output."""
    from experiments.patching.compare import logit_comparison, relative_error

    idx = dict(index, step=st.step, token=token_text, token_id=st.token_id)
    want = reference.logits[st.step]
    judged = st.witness.logits if st.witness is not None else st.patched.logits
    ctx.log_many(logit_comparison(want, judged), **idx)
    ctx.log("cached_vs_uncached_logit_linf_rel", logit_comparison(want, st.context)["logit_linf_rel"], **idx)
    if st.control is not None:
        ctrl = logit_comparison(want, st.control.logits)
        ctx.log_many({f"control_{k}": ctrl[k] for k in ("logit_linf", "tvd", "top1_match")}, **idx)
    if st.last_layer is not None:
        last = logit_comparison(want, st.last_layer.logits)
        ctx.log_many({f"last_layer_{k}": last[k] for k in ("logit_linf", "logit_linf_rel", "top1_match")}, **idx)
    if st.stock is not None:
        stock = logit_comparison(want, st.stock)
        ctx.log_many({f"stock_{k}": stock[k] for k in ("logit_linf_rel", "tvd", "top1_match")}, **idx)
    if st.witness is not None:
        for layer, (seen, ref) in enumerate(zip(st.witness.hidden, reference.hidden, strict=True)):
            ctx.log("witness_hidden_rel", relative_error(ref[st.step], seen), layer=layer, **idx)
