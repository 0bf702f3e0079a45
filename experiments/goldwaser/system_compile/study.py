"""One system prompt, start to end: the prompted model's greedy replies to every query (the reference), the
control (the same model without the prompt), the fit data both methods share, then each method compiled,
measured on the fit and the held-out queries, optionally saved, and taken out of the weights again."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from experiments.core.results import RunContext
from experiments.goldwaser.system_compile.analytic import FitSequence, budget, fit_patch, fit_targets
from experiments.goldwaser.system_compile.bake import BakeExample, BakeSettings, bake
from experiments.goldwaser.system_compile.behaviours import check_for
from experiments.goldwaser.system_compile.inputs import QueryIds, encode
from experiments.goldwaser.system_compile.measure import Generation, Reference, heldout_kl, measure_model
from experiments.goldwaser.system_compile.replies import generate, reply_logits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    check: str


@dataclass(frozen=True)
class FitItem:
    """One continuation the methods are fitted on: a fit query's ids, the reply, the teacher's logits along it."""

    ids: QueryIds
    reply: tuple[int, ...]
    logits: torch.Tensor


@torch.no_grad()
def reference(cfg: DictConfig, model, tokenizer, gen: Generation, prompt: Prompt, fit: list[str],
              held: list[str]) -> Reference:
    ids = [encode(tokenizer, str(cfg.template), str(cfg.query_format), prompt.text, q) for q in fit + held]
    replies = gen.free(model, [i.prompted for i in ids])
    logits = [reply_logits(model, i.prompted, r) for i, r in zip(ids, replies, strict=True)]
    return Reference(ids, ["fit"] * len(fit) + ["heldout"] * len(held), replies, logits)


@torch.no_grad()
def fit_items(cfg: DictConfig, model, ref: Reference, gen: Generation, seed: int) -> list[FitItem]:
    """The fit continuations: the reference's greedy replies to the fit queries, or `samples` replies to each
    sampled at `temperature` from a generator seeded with `seed`."""
    fit = ref.indices("fit")
    if str(cfg.continuations) == "greedy":
        return [FitItem(ref.ids[i], tuple(ref.replies[i]), ref.logits[i]) for i in fit]
    generator = torch.Generator().manual_seed(seed)
    ids = [ref.ids[i] for i in fit for _ in range(int(cfg.samples))]
    replies = generate(model, [i.prompted for i in ids], gen.max_new, set(gen.stop_ids), gen.pad_id,
                       generator=generator, temperature=float(cfg.temperature))
    return [FitItem(i, tuple(r), reply_logits(model, i.prompted, r)) for i, r in zip(ids, replies, strict=True)]


def compile_analytic(cfg: DictConfig, ctx: RunContext, lm, adapter, items: list[FitItem], pad_id: int, **index):
    """Table 1's fixed patch over every fit position (analytic.py), with its per-layer fit logged."""
    suffix = str(cfg.fit_positions) == "suffix"
    sequences = [FitSequence((*it.ids.prompted, *it.reply[:-1]), (*it.ids.plain, *it.reply[:-1]),
                             (it.ids.shared - 1 + len(it.reply)) if suffix else len(it.reply)) for it in items]
    targets = fit_targets(lm, adapter, sequences, ctx.device)
    rank = None if cfg.analytic_rank is None else int(cfg.analytic_rank)
    patch = fit_patch(lm, adapter, sequences, targets, pad_id, rank, float(cfg.ridge))
    for fit in patch.layers:
        ctx.log_many(dict(z_rank=fit.rank, input_rel=fit.input_rel, output_residual=fit.output_residual,
                          r_norm=fit.r_norm), layer=fit.layer, method="analytic", **index)
    ctx.log("fit_positions", patch.k, method="analytic", **index)
    return patch, budget(patch, lm, rank)


def compile_bake(cfg: DictConfig, ctx: RunContext, lm, ref: Reference, items: list[FitItem], **index):
    data = [BakeExample(it.ids.plain, it.reply, torch.log_softmax(it.logits, -1)) for it in items]
    settings = BakeSettings(rank=int(cfg.rank), alpha=float(cfg.alpha), targets=tuple(cfg.lora_targets),
                            steps=int(cfg.steps), lr=float(cfg.lr), batch=int(cfg.batch),
                            eval_every=int(cfg.eval_every), seed=int(cfg.seed))
    measure, spent = heldout_kl(ref), [0.0]

    def timed(model) -> float:  # the held-out curve is a measurement, not compile work: timed apart
        t0 = time.perf_counter()
        try:
            return measure(model)
        finally:
            spent[0] += time.perf_counter() - t0

    with torch.enable_grad():
        merged = bake(lm, data, settings, lambda metric, value, **at: ctx.log(metric, value, method="bake",
                                                                                 **at, **index), timed)
    return merged, merged.budget(lm), spent[0]


def run_prompt(cfg: DictConfig, ctx: RunContext, bundle, adapter, gen: Generation, p: int, prompt: Prompt,
               fit: list[str], held: list[str], control: list[list[int]], save) -> dict:
    """Everything for one system prompt (module docstring); returns the decoded generations per method.
    `save(ctx, bundle, ref, gen, prompt, method, change)` keeps the checkpoint of method `cfg.save` (or None)."""
    from experiments.core.runtime import dtype_name

    model, tok = bundle.model, bundle.tokenizer
    check = check_for(prompt.check)
    index = dict(model=str(cfg.model), prompt=prompt.name, dtype=dtype_name(ctx.dtype))
    t0 = time.perf_counter()
    ref = reference(cfg, model, tok, gen, prompt, fit, held)
    ctx.log("reference_s", time.perf_counter() - t0, method="reference", **index)
    texts = {"reference": {"fit": [], "heldout": []}}
    for i, reply in enumerate(ref.replies):
        text = gen.decode(reply)
        ctx.log("behaviour", float(check(text)), method="reference", split=ref.splits[i], query=i, **index)
        texts["reference"][ref.splits[i]].append(text)
    texts["control"] = measure_model(model, ref, gen, check, ctx.log, generations=control, method="control", **index)
    t0 = time.perf_counter()
    items = fit_items(cfg, model, ref, gen, seed=int(cfg.seed) + p)
    ctx.log("data_s", time.perf_counter() - t0, method="reference", **index)  # the fit continuations
    for method in [str(m) for m in cfg.methods]:
        log.info("%s: compiling %r with %s", prompt.name, prompt.text, method)
        t0 = time.perf_counter()
        evals_s = 0.0
        if method == "analytic":
            change, cost = compile_analytic(cfg, ctx, model, adapter, items, gen.pad_id, **index)
        else:
            change, cost, evals_s = compile_bake(cfg, ctx, model, ref, items, **index)
            ctx.log("bake_eval_s", evals_s, method=method, **index)
        ctx.log("compile_s", time.perf_counter() - t0 - evals_s, method=method, **index)
        try:
            ctx.log_many(cost, method=method, **index)
            texts[method] = measure_model(model, ref, gen, check, ctx.log, method=method, **index)
            if save is not None and method == str(cfg.save):
                save(ctx, bundle, ref, gen, prompt, method, change)
        finally:
            change.restore(model)
    return texts
