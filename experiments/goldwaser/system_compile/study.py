"""One system prompt, start to end: the prompted model's greedy replies to every query (the reference), the
control (the same model without the prompt), the fit data both methods share, then each method compiled,
measured on the fit and the held-out queries, optionally saved, and taken out of the weights again."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from experiments.core.results import RunContext
from experiments.goldwaser.system_compile.analytic import FitSequence, budget, fit_patch, fit_targets
from experiments.goldwaser.system_compile.bake import BakeExample, BakeSettings, bake
from experiments.goldwaser.system_compile.behaviours import check_for
from experiments.goldwaser.system_compile.budgets import Point, choose, points
from experiments.goldwaser.system_compile.claims import LEAK_FLOOR, rounding_kl
from experiments.goldwaser.system_compile.coherence import MISCALIBRATED, Judge, threshold
from experiments.goldwaser.system_compile.inputs import QueryIds, encode
from experiments.goldwaser.system_compile.measure import (
    Generation,
    Reference,
    StockView,
    judge_replies,
    mean_kl,
    measure_model,
)
from experiments.goldwaser.system_compile.replies import generate, reply_logits
from experiments.goldwaser.system_compile.schema import SystemCompileConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    check: str


@dataclass(frozen=True)
class FitItem:
    """One continuation the methods are fitted on: a fit query's ids, the reply, the teacher's logits along it,
    and the query's index in the reference (a budget sweep leaves its validation queries' items out)."""

    ids: QueryIds
    reply: tuple[int, ...]
    logits: torch.Tensor
    query: int


@torch.no_grad()
def reference(cfg: SystemCompileConfig, model, tokenizer, gen: Generation, prompt: Prompt, fit: list[str],
              held: list[str]) -> Reference:
    ids = [encode(tokenizer, cfg.template, cfg.query_format, prompt.text, q) for q in fit + held]
    replies = gen.free(model, [i.prompted for i in ids])
    logits = [reply_logits(model, i.prompted, r) for i, r in zip(ids, replies, strict=True)]
    return Reference(ids, ["fit"] * len(fit) + ["heldout"] * len(held), replies, logits)


@torch.no_grad()
def fit_items(cfg: SystemCompileConfig, model, ref: Reference, gen: Generation, seed: int) -> list[FitItem]:
    """The fit continuations: the reference's greedy replies to the fit queries, or `samples` replies to each
    sampled at `temperature` from a generator seeded with `seed`."""
    fit = ref.indices("fit")
    if cfg.continuations == "greedy":
        return [FitItem(ref.ids[i], tuple(ref.replies[i]), ref.logits[i], i) for i in fit]
    generator = torch.Generator().manual_seed(seed)
    queries = [i for i in fit for _ in range(cfg.samples)]
    ids = [ref.ids[i] for i in queries]
    replies = generate(model, [i.prompted for i in ids], gen.max_new, set(gen.stop_ids), gen.pad_id,
                       generator=generator, temperature=cfg.temperature)
    return [FitItem(i, tuple(r), reply_logits(model, i.prompted, r), q)
            for i, r, q in zip(ids, replies, queries, strict=True)]


def compile_analytic(cfg: SystemCompileConfig, ctx: RunContext, lm, adapter, items: list[FitItem], pad_id: int,
                     point: Point, quiet: bool = False, **index):
    """Table 1's fixed patch over every fit position (analytic.py) at `point`'s rank and ridge, with its
    per-layer fit logged (not for a point of the budget sweep: `quiet`)."""
    suffix = cfg.fit_positions == "suffix"
    sequences = [FitSequence((*it.ids.prompted, *it.reply[:-1]), (*it.ids.plain, *it.reply[:-1]),
                             (it.ids.shared - 1 + len(it.reply)) if suffix else len(it.reply)) for it in items]
    targets = fit_targets(lm, adapter, sequences, ctx.device)
    patch = fit_patch(lm, adapter, sequences, targets, pad_id, point.rank, point.ridge)
    if not quiet:
        for fit in patch.layers:
            ctx.log_many(dict(z_rank=fit.rank, input_rel=fit.input_rel, output_residual=fit.output_residual,
                              r_norm=fit.r_norm), layer=fit.layer, method="analytic", **index)
        ctx.log("fit_positions", patch.k, method="analytic", **index)
    return patch, budget(patch, lm, point.rank), 0.0


def compile_bake(cfg: SystemCompileConfig, ctx: RunContext, lm, ref: Reference, items: list[FitItem], point: Point,
                 curve: list[int], curve_split: str, **index):
    """The baked LoRA at `point`'s rank and steps; its curve measured on `curve` (indices into `ref`; none when
    empty), timed apart from the compile (returned third)."""
    data = [BakeExample(it.ids.plain, it.reply, torch.log_softmax(it.logits, -1)) for it in items]
    settings = BakeSettings(rank=point.rank, alpha=cfg.alpha, targets=tuple(cfg.lora_targets),
                            steps=point.steps, lr=cfg.lr, batch=cfg.batch,
                            eval_every=cfg.eval_every, seed=cfg.seed)
    measure, spent = mean_kl(ref, curve) if curve else None, [0.0]

    def timed(model) -> float:  # the curve is a measurement, not compile work: timed apart
        t0 = time.perf_counter()
        try:
            return measure(model)
        finally:
            spent[0] += time.perf_counter() - t0

    with torch.enable_grad():
        merged = bake(lm, data, settings, lambda metric, value, **at: ctx.log(metric, value, method="bake",
                                                                                 **{**index, **at}),
                      timed if measure else None, curve_split)
    return merged, merged.budget(lm), spent[0]


def compile_at(cfg: SystemCompileConfig, ctx: RunContext, lm, adapter, ref: Reference, items: list[FitItem],
               gen: Generation, point: Point, curve: list[int], curve_split: str, quiet: bool = False, **index):
    """One method compiled at one budget point: (the change to restore, its budget, compile seconds), the
    seconds without the bake's curve evaluations (logged apart as bake_eval_s)."""
    t0 = time.perf_counter()
    if point.method == "analytic":
        change, cost, evals_s = compile_analytic(cfg, ctx, lm, adapter, items, gen.pad_id, point, quiet, **index)
    else:
        change, cost, evals_s = compile_bake(cfg, ctx, lm, ref, items, point, curve, curve_split, **index)
        ctx.log("bake_eval_s", evals_s, method=point.method, **index)
    return change, cost, time.perf_counter() - t0 - evals_s


def choose_point(cfg: SystemCompileConfig, ctx: RunContext, lm, adapter, ref: Reference, items: list[FitItem],
                 gen: Generation, method: str, **index) -> Point:
    """The method's budget point (budgets.py): without validation= the only one, else the one of lowest
    KL on the validation queries (one point alone is scored there all the same), each point compiled on the
    other fit queries. Every point's validation KL
    and compile seconds go to metrics.csv (split=validation) with its index (budget_point) and knobs
    (budget_rank, budget_ridge, budget_steps)."""
    grid = points(cfg, method)
    validation = ref.indices("fit")[len(ref.indices("fit")) - cfg.validation:] if cfg.validation else []
    if not validation:  # nothing to choose on: no compile on the other fit queries
        return grid[0]
    # a single point under validation= is scored too: its validation KL and the bake's curve on the validation
    # queries are what the run was asked for, even with nothing to choose between
    train = [it for it in items if it.query not in set(validation)]
    scored = []
    for j, point in enumerate(grid):
        log.info("%s: budget point %d/%d for %s (%s)", index["prompt"], j + 1, len(grid), method, point.label())
        at = dict(index, budget_point=j, **point.columns())
        change, _, seconds = compile_at(cfg, ctx, lm, adapter, ref, train, gen, point, validation,
                                        "validation", quiet=True, **at)
        try:
            kl = mean_kl(ref, validation)(lm)
        finally:
            change.restore(lm)
        ctx.log("validation_kl", kl, method=method, split="validation", **at)
        ctx.log("compile_s", seconds, method=method, split="validation", **at)
        scored.append((point, kl, seconds))
    chosen = choose(scored)
    log.info("%s: %s chose %s on %d validation queries", index["prompt"], method, chosen.label(), len(validation))
    return chosen


def run_prompt(cfg: SystemCompileConfig, ctx: RunContext, bundle, adapter, gen: Generation, p: int, prompt: Prompt,
               fit: list[str], held: list[str], control: list[list[int]], save) -> dict:
    """Everything for one system prompt (module docstring); returns the decoded generations per method.
    `save(ctx, bundle, ref, gen, prompt, method, change)` keeps the checkpoint of method `cfg.save` (or None)."""
    from experiments.core.runtime import dtype_name

    model, tok = bundle.model, bundle.tokenizer
    check = check_for(prompt.check)
    index = dict(model=cfg.model, prompt=prompt.name, dtype=dtype_name(ctx.dtype))
    t0 = time.perf_counter()
    ref = reference(cfg, model, tok, gen, prompt, fit, held)
    ctx.log("reference_s", time.perf_counter() - t0, method="reference", **index)
    for i in range(len(ref.replies)):
        # what a rounding-level change of these logits could make: a compiled model below it is a leak (claims.py)
        ctx.log(LEAK_FLOOR, rounding_kl(ref.logits[i], index["dtype"]), method="reference", split=ref.splits[i],
                query=i, **index)
    # the control: the stock model fed each query alone; along the prompted replies it also scores them, which
    # calibrates the judge once, on the fit queries' replies (coherence.py)
    control_tokens, scores = measure_model(model, ref, gen, ctx.log, generations=control, method="control", **index)
    judge = Judge(check, threshold([scores[i] for i in ref.indices("fit")]))
    texts = {"reference": judge_replies(model, ref, gen, judge, ctx.log, ref.replies, scores, method="reference",
                                        **index),
             "control": judge_replies(model, ref, gen, judge, ctx.log, control_tokens, method="control", **index)}
    log_agreement(ctx, ref, judge, scores, prompt.check, **index)
    t0 = time.perf_counter()
    items = fit_items(cfg, model, ref, gen, seed=cfg.seed + p)
    ctx.log("data_s", time.perf_counter() - t0, method="reference", **index)  # the fit continuations
    curve = ref.indices("heldout")  # the final compile's curve: reporting only, it chooses nothing
    for method in [str(m) for m in cfg.methods]:
        point = choose_point(cfg, ctx, model, adapter, ref, items, gen, method, **index)
        log.info("%s: compiling %r with %s (%s)", prompt.name, prompt.text, method, point.label())
        change, cost, seconds = compile_at(cfg, ctx, model, adapter, ref, items, gen, point,
                                           curve if not cfg.validation else [], "heldout", **index)
        ctx.log("compile_s", seconds, method=method, **index, **point.columns())
        try:
            ctx.log_many(cost, method=method, **index)
            tokens, _ = measure_model(model, ref, gen, ctx.log, method=method, **index)
            # judged by the model it was compiled from: the stock weights read in place of the changed ones
            texts[method] = judge_replies(StockView(model, change.originals), ref, gen, judge, ctx.log, tokens,
                                          method=method, **index)
            if save is not None and method == cfg.save:
                save(ctx, bundle, ref, gen, prompt, method, change)
        finally:
            change.restore(model)
    return texts


def log_agreement(ctx: RunContext, ref: Reference, judge: Judge, scores: list[float], check: str, **index) -> None:
    """How far the judge agrees with the prompted model's own held-out replies: the threshold, the share of them
    at or above it (coherence_agreement) and the share the whole check passes (check_agreement); a check that
    fails MISCALIBRATED or more of them says so in the run's notes (and summary.md, from these metrics)."""
    held = ref.indices("heldout")
    coherent = sum(scores[i] >= judge.floor for i in held) / len(held)
    rows = ctx.metrics()
    passed = rows[(rows["metric"] == "behaviour") & (rows["method"] == "reference") & (rows["split"] == "heldout")
                  & (rows["prompt"] == index["prompt"])]["value"]
    agreement = float(passed.mean())
    ctx.log("coherence_threshold", judge.floor, method="reference", **index)
    ctx.log_many(dict(coherence_agreement=coherent, check_agreement=agreement), method="reference", split="heldout",
                 **index)
    if agreement < 1 - MISCALIBRATED:
        ctx.notes.append(f"check {check!r} ({index['prompt']}) passes {agreement:.0%} of the prompted model's own "
                         f"{len(held)} held-out replies (likelihood threshold: {coherent:.0%}): below "
                         f"{1 - MISCALIBRATED:.0%}, the check is miscalibrated for this model or the model does not "
                         "follow the prompt; its rates say little about a compile")
