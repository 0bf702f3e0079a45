"""layer_errors — Goldwaser et al. Alg. 1 and the closed loop on trained weights, layer by layer: is it the
algorithm or the implementation?

Setup. Each prompt is generated greedily with its context; at every token the query alone runs through the
patched model (experiments/patching/patcher.py), for each dtype (float32, and float64 that is float64 end to
end) and each variant: naive (Alg. 1, open loop), closed_loop_scale (Thm 10 alone, inside the closed loop),
closed_loop (W_down conditioned so Thm 10 divides by ±1). Per layer it records
- hidden_rel: max |x′_l − x_l| / max |x_l|, the patched pass against the with-context pass, and dm_linf,
  the largest entry of the layer's output update (Δm for Gemma's post-MLP scale);
- the layer's gain measured directly: the patched layer alone (its patched tensors substituted), at the
  with-context input x_l, ‖T′(x + δ) − T′(x)‖ / ‖δ‖ for a random δ, beside the original layer's gain for
  the same x and δ (the control), absolute and relative (`layer_gain.gain`);
and per token the logits' agreement and the one-ulp sensitivity of the whole patched model (every layer's
patched tensors, embedding output moved by one ulp) beside the unpatched model's.

If the open loop's error is amplified beyond accumulation in float64 as in float32, rounding is not what
grows it: the patched layers amplify whatever input error they get (their gain against the original's
says by how much), so the algorithm, not this implementation, is what float64 cannot absorb. Where the
output rule divides by no MLP output (a matrix, Thm 9) the level itself is bounded: every layer within the
dtype's rounding bar (patching/compare.ROUNDING). The closed
loop on the same weights, the same code path, exact at every layer, is the control on the implementation.
Claims: claims.py; figure: plots.py (beside this file).
"""

from __future__ import annotations

import functools
import math

from experiments.core.errors import UserError
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.validation import require_positive
from experiments.goldwaser.layer_errors import LayerErrorsConfig
from experiments.goldwaser.layer_errors.claims import (
    algorithm1,
    check_claims,
    closed_loop_thm10_alone,
    conditioned_closed_loop,
)
from experiments.patching.kinds import ACTION, MATERIALIZED
from experiments.patching.variants import VARIANTS

# variants=null: those the block takes of the ones the claims are about (claims.py: each role, as declared)
DEFAULT_VARIANTS = tuple(name for role in (algorithm1, closed_loop_thm10_alone, conditioned_closed_loop)
                         for name, v in VARIANTS.items() if role(v))


# -- config --------------------------------------------------------------------------------------
def _once_each(key: str, names: list) -> None:
    """A list key of names (the schema's Enum has checked each) must name something, and each once."""
    if not names:
        raise UserError(f"{key}= must be a non-empty list")
    if len(set(names)) != len(names):
        raise UserError(f"{key}= lists [{', '.join(names)}]: each at most once")


def validate(cfg: LayerErrorsConfig) -> None:
    """Everything checkable before a run folder exists, the model's architecture and variants included."""
    from experiments.core.runtime import resolve_device, resolve_dtype
    from experiments.goldwaser.common import check_witness_fits
    from experiments.patching.arch import adapter_for
    from experiments.patching.load import check_patchable
    from experiments.patching.variants import check_apply, check_variant

    _once_each("dtypes", cfg.dtypes)
    if cfg.variants is not None:
        _once_each("variants", cfg.variants)
    require_positive(cfg, "max_new_tokens")
    if not cfg.prompts or not all(p.strip() for p in cfg.prompts):
        raise UserError("prompts= must be a non-empty list of non-empty prompts, like [\"Hi.\"]")
    for dtype in cfg.dtypes:
        if not 0.0 < cfg.delta_rel.get(dtype, math.nan) < 1.0:  # a dtype without its δ is refused too
            raise UserError(f"delta_rel.{dtype} must be in (0, 1): the size of δ relative to the layer's input")
    largest = max((resolve_dtype(d) for d in cfg.dtypes), key=lambda t: t.itemsize)
    device = resolve_device(cfg.device)
    config = check_patchable(cfg.model, largest, device)
    check_witness_fits(cfg, config, largest, device, list(cfg.prompts), cfg.max_new_tokens,
                       copies=cfg.apply != ACTION)
    adapter = adapter_for(config.model_type)
    for variant in chosen_variants(cfg, adapter):
        check_apply(adapter, check_variant(adapter, variant), cfg.apply)


def chosen_variants(cfg: LayerErrorsConfig, adapter) -> list[str]:
    """variants=..., or where none are given naive, closed_loop_scale (a post-MLP norm's Thm 10 alone) where the
    block takes it, and closed_loop; with apply=action the open loop's alone (a closed loop takes no action)."""
    if cfg.variants is not None:
        return list(cfg.variants)
    action = cfg.apply == ACTION
    return [v for v in DEFAULT_VARIANTS if VARIANTS[v].unsupported(adapter) is None
            and (VARIANTS[v].evidence or not action)]


# -- the run -------------------------------------------------------------------------------------
def run(cfg: LayerErrorsConfig, ctx: RunContext) -> None:
    """Per dtype (the model loaded in it), per variant, per prompt and token: `measure_prompt`."""
    from experiments.core.runtime import resolve_dtype
    from experiments.core.samples import token_sample
    from experiments.patching.arch import adapter_for
    from experiments.patching.compare import logit_dtype
    from experiments.patching.load import check_patchable, load_checked, model_label
    from experiments.patching.witness import Witness
    from experiments.zoo.prompts import encode_prompt
    from experiments.zoo.threads import threads_for

    ctx.model = model_label(cfg.model)
    adapter = adapter_for(check_patchable(cfg.model, resolve_dtype("float32"), ctx.device).model_type)  # its family
    dtypes, variants = cfg.dtypes, chosen_variants(cfg, adapter)
    prompts, n_tokens = cfg.prompts, cfg.max_new_tokens
    total = len(dtypes) * len(variants) * len(prompts) * n_tokens
    with progress(total, ctx.experiment) as bar:
        for dtype in dtypes:
            bundle = load_checked(cfg.model, resolve_dtype(dtype), ctx.device, seed=cfg.seed)
            encoded = [encode_prompt(bundle, text, None, cfg.chat_template, ctx.device) for text in prompts]
            # the block's output rule decides what the open loop's claims expect (claims.py)
            index = dict(model=cfg.model, preset=cfg.preset, dtype=dtype, rule=adapter.output_rule.key,
                         apply=cfg.apply)
            original_sensitivity: dict = {}  # the unpatched model's: the same for every variant
            witness = Witness(bundle.model, adapter.layers, logit_dtype(bundle.model.dtype))
            with threads_for(bundle.model):
                for variant in variants:
                    for p, inputs in enumerate(encoded):
                        results = []
                        for result in measure_prompt(bundle.model, variant, inputs, n_tokens,
                                                     cfg.delta_rel[dtype], cfg.seed, original_sensitivity,
                                                     key=p, apply=cfg.apply, witness=witness):
                            log_token(ctx, result, variant=variant, prompt=p, **index)
                            ctx.sample(token_sample(bundle.tokenizer, result["step"], result["context"],
                                                    result["patched"].logits, result["control"], prompt=p,
                                                    position=inputs["input_ids"].shape[1] + result["step"],
                                                    variant=variant, dtype=dtype))
                            results.append(result)
                            bar.advance(1, info=f"{dtype} {variant} prompt {p + 1}/{len(prompts)}")
                        reference = witness.reference(inputs, [r["token_id"] for r in results[1:]], len(results))
                        for result in results:
                            log_judged(ctx, result, reference, variant=variant, prompt=p, **index)
            del bundle
    check_claims(ctx, ctx.metrics(), "_action" if cfg.apply == ACTION else "")


def measure_prompt(model, variant: str, inputs: dict, n_tokens: int, delta_rel: float, seed: int,
                   original_sensitivity: dict, key=0, apply: str = MATERIALIZED, witness=None):
    """Greedy generation with the context; at each token the patched pass and its per-layer measurements, the
    unpatched model's distance to the record beside them (the control), and for a closed loop how far its
    patches are from its open-loop counterpart's. `original_sensitivity` caches the unpatched model's one-ulp
    sensitivity by (key, token position). With a `witness` an open loop's patched tensors also run through it
    (`witness`, `witness_diff`: generate.witnessed); its reference comes after the prompt (`log_judged`)."""
    import torch

    from experiments.goldwaser.layer_gain import one_ulp_sensitivity
    from experiments.patching.generate import witnessed
    from experiments.patching.patcher import Patcher
    from experiments.patching.variants import VARIANTS

    patcher = Patcher(model, variant, apply)
    counterpart = patcher.variant.open_counterpart(patcher.adapter)
    cache, query = patcher.start(inputs)
    for step in range(n_tokens):
        ctx = patcher.context_step({"input_ids": query}, cache)
        context, cache = ctx.logits, ctx.cache
        keep: dict = {}
        patched = patcher.patched_pass(query, ctx, keep=keep)
        seen, diff = witnessed(witness, query, patched)
        actions = patcher.open_loop_actions()  # apply=action: the matrices' updates, added by hooks where run
        gains = layer_gains(patcher, query, ctx.targets, keep, delta_rel, torch.Generator().manual_seed(seed + step),
                            actions)
        if (key, step) not in original_sensitivity:
            original_sensitivity[key, step] = one_ulp_sensitivity(model, query)
        control = patcher.control_pass(query, ctx.record)
        per_layer = [dict(g, control_hidden_rel=c) for g, c in zip(gains, control.hidden_rel, strict=True)]
        if counterpart:
            open_keep: dict = {}
            patcher.patched_pass(query, ctx, keep=open_keep, variant=VARIANTS[counterpart])
            for row, diff in zip(per_layer, patch_distance(patcher, keep, open_keep), strict=True):
                row["patch_rel_to_open_loop"] = diff
        yield dict(step=step, token_id=int(query.view(-1)[0]), patched=patched, per_layer=per_layer,
                   witness=seen, witness_diff=diff, one_ulp_patched=patched_sensitivity(model, query, keep, actions),
                   one_ulp_original=original_sensitivity[key, step], context=context, control=control.logits)
        query = context.argmax().view(1, 1).to(query.device)


def patched_sensitivity(model, query, keep: dict, actions: dict) -> float:
    """The patched model's one-ulp sensitivity: its written tensors in place, its kept actions hooked."""
    from experiments.goldwaser.layer_gain import one_ulp_sensitivity
    from experiments.patching.patcher import applied_actions

    with applied_actions(model, actions):
        return one_ulp_sensitivity(model, query, keep)


def layer_gains(patcher, query, caps, keep: dict, delta_rel: float, generator,
                actions: dict | None = None) -> list[dict[str, float]]:
    """Per layer, at the with-context input x_l and for one random δ (the same for both): the gain of the
    layer with its patched tensors (and its kept actions, apply=action) and of the original layer, absolute
    and relative."""
    from experiments.goldwaser.layer_gain import gain, layer_calls, random_direction
    from experiments.patching.patcher import applied_actions

    out = []
    calls = layer_calls(patcher.lm, patcher.layers, query)  # the decoder body: no LM head needed
    for index, (call, cap) in enumerate(zip(calls, caps, strict=True)):
        prefix = patcher.layer_names[index] + "."
        params = {name[len(prefix):]: t for name, t in keep.items() if name.startswith(prefix)}
        mine = {name: a for name, a in (actions or {}).items() if name.startswith(prefix)}
        if not params and not mine:
            raise RuntimeError(f"layer {index}: the patched pass kept no patched tensors")
        x = cap.x_in.to(patcher.dtype)
        delta = random_direction(x, delta_rel, generator)
        with applied_actions(patcher.model, mine):
            g_patched, g_patched_rel = gain(functools.partial(call.run, params=params), x, delta)
        g_original, g_original_rel = gain(call.run, x, delta)
        out.append(dict(gain_patched=g_patched, gain_original=g_original,
                        gain_rel_patched=g_patched_rel, gain_rel_original=g_original_rel))
    return out


def patch_distance(patcher, closed: dict, opened: dict) -> list[float]:
    """Per layer, ‖ΔW_closed − ΔW_open‖ / ‖ΔW_open‖ over the layer's patched tensors (Frobenius, float64):
    how far the closed loop's patch is from the open loop's, which it equals in exact arithmetic."""
    params = dict(patcher.model.named_parameters())
    out = []
    for name in patcher.layer_names:
        diff = size = 0.0
        for key, tensor in opened.items():
            if key.startswith(name + "."):
                diff += float((closed[key].double() - tensor.double()).square().sum())
                size += float((tensor.double() - params[key].detach().double()).square().sum())
        out.append(math.sqrt(diff / max(size, 1e-300)))
    return out


def log_token(ctx: RunContext, result: dict, **index) -> None:
    idx = dict(index, token=result["step"], token_id=result["token_id"])
    if result["witness"] is not None:  # the instrumented pass against the witness: 0 when they agree bit for bit
        ctx.log("witness_vs_instrumented_linf", result["witness_diff"], **idx)
    ctx.log_many({k: result[k] for k in ("one_ulp_patched", "one_ulp_original")}, **idx)
    patched = result["patched"]
    for layer, (rel, stats, more) in enumerate(zip(patched.hidden_rel, patched.layer_stats, result["per_layer"],
                                                   strict=True)):
        ctx.log_many(dict(hidden_rel=rel, dm_linf=stats.dm_linf, **more), layer=layer, **idx)


def log_judged(ctx: RunContext, result: dict, reference, **index) -> None:
    """A token judged against the witness's reference (its uncached with-context forward, patching/witness.py):
    the patched logits (the witness's forward of the patched tensors for an open loop, the pass's own for a
    closed loop), the KV-cached with-context logits, and for an open loop each layer's output."""
    from experiments.patching.compare import logit_comparison, relative_error

    idx = dict(index, token=result["step"], token_id=result["token_id"])
    want, seen = reference.logits[result["step"]], result["witness"]
    ctx.log_many(logit_comparison(want, seen.logits if seen is not None else result["patched"].logits), **idx)
    ctx.log("cached_vs_uncached_logit_linf_rel", logit_comparison(want, result["context"])["logit_linf_rel"], **idx)
    if seen is not None:
        for layer, (mine, ref) in enumerate(zip(seen.hidden, reference.hidden, strict=True)):
            ctx.log("witness_hidden_rel", relative_error(ref[result["step"]], mine), layer=layer, **idx)
