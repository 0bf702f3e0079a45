"""system_compile's claims, per system prompt, each from two independent computations on that prompt's HELD-OUT
queries: a compiled model's forward without the system prompt, against the unprompted model's (the control)
or the other method's, both measured against the prompted model's own distributions.

Every (prompt, method) pair has its own claims, because a pooled claim says more than it measures: pooling
the replies of six prompts as if every reply were independent passes six prompts at 3/16 that none would
alone, and one prompt at 16/16 beside one at 0/16; a ratio of means over prompts passes a method ten times
worse than the control on two prompts of three. What pools is a summary (`pooled`: how many prompts pass
each claim, the geometric mean of the KL ratios), logged and written beside the table, never a claim.

A KL of 0 is a result: the ratios divide as floats do (x / 0 = inf, 0 / 0 = NaN, which fails), and a
compiled model closer to the prompted one than a rounding-level change of the logits could make it is a LEAK
(it read the prompt's tokens, or is the prompted model): its `no_leak` claim fails. The directions are the
ones expected before measuring; what fails is reported as measured. The fit queries' numbers stay in
metrics.csv: for the analytic patch they are a construction (least squares at those very positions)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from experiments.core.results import RunContext
from experiments.goldwaser.system_compile.rates import rate_table
from experiments.goldwaser.system_compile.schema import SystemCompileConfig
from experiments.patching.compare import rounding_bar

REF = "beyond the papers: a system prompt compiled into weights (Goldwaser §6; Prompt Baking)"
METHOD_WORDS = {"analytic": "the analytic fixed patch (least squares over the fit queries' positions)",
                "bake": "the baked LoRA (trained on KL over the fit queries' continuations)"}
INTERVAL = ("95 % Wilson intervals on this prompt's held-out replies: lower end of the one minus upper end of the "
            "control's; bar: margin=")
LEAK_FLOOR = "leak_floor"  # per held-out query: the KL a rounding-level change of the prompted logits could make


def claim_name(prompt: str) -> str:
    """A system prompt's name as a claim id part: lowercase, [a-z0-9_] ("Ahoy-2" -> "ahoy_2")."""
    return re.sub(r"[^a-z0-9_]+", "_", str(prompt).lower()).strip("_") or "prompt"


def ratio(a: float, b: float) -> float:
    """a / b as floats divide, so a KL of 0 is a number, not a crash: x / 0 = inf, 0 / 0 = NaN (fails)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def rounding_kl(reference_logits, dtype: str) -> float:
    """The mean over a reply's rows of ½ (r · max |logit|)², r the dtype's rounding bar (compare.ROUNDING): to
    second order the largest KL a change of every logit by at most the rounding of a stock forward makes. A
    compiled model below it on a held-out query is the prompted model, not a compile (a leak)."""
    bar = rounding_bar(dtype)
    peak = reference_logits.double().abs().amax(-1)
    return float((0.5 * (bar * peak) ** 2).mean())


def heldout_kl(m: pd.DataFrame, method: str) -> pd.Series:
    """Per system prompt, the mean KL over its held-out queries."""
    rows = m[(m["method"] == method) & (m["metric"] == "kl") & (m["split"] == "heldout")]
    return rows.groupby("prompt")["value"].mean()


def leak_decades(m: pd.DataFrame, method: str, prompt: str) -> float:
    """log10 of the smallest held-out KL / leak floor over the prompt's queries: ≥ 0 when every query's KL is
    above what rounding could make; -inf for a KL of 0."""
    rows = m[(m["prompt"] == prompt) & (m["split"] == "heldout")]
    kl = rows[(rows["method"] == method) & (rows["metric"] == "kl")].set_index("query")["value"]
    floor = rows[rows["metric"] == LEAK_FLOOR].set_index("query")["value"]
    both = pd.concat([kl.rename("kl"), floor.rename("floor")], axis=1).dropna()
    if not len(both):
        return math.nan
    with np.errstate(divide="ignore"):
        return float(np.log10((both["kl"] / both["floor"]).min()))


def check_claims(cfg: SystemCompileConfig, ctx: RunContext, m: pd.DataFrame) -> dict[str, dict[str, bool]]:
    """Every (prompt, method) pair's claims; returns the verdicts by claim kind and prompt, for `pooled`."""
    measured = [str(x) for x in cfg.methods]
    prompts = list(dict.fromkeys(m.loc[m["metric"] == "kl", "prompt"]))
    rates = rate_table(m).set_index(["prompt", "method"])
    kl = {x: heldout_kl(m, x) for x in ("control", *measured)}
    verdicts: dict[str, dict[str, bool]] = {}

    def check(kind: str, prompt: str, *args, **kwargs) -> None:
        passed = ctx.check(f"system_compile.heldout.{claim_name(prompt)}.{kind}", REF, *args, **kwargs)
        verdicts.setdefault(kind, {})[prompt] = bool(passed)

    for prompt in prompts:
        held = int(m.loc[(m["metric"] == "kl") & (m["split"] == "heldout") & (m["prompt"] == prompt),
                         "query"].nunique())
        where = f"{cfg.model}, system prompt {prompt!r}, {held} held-out queries"

        def above_control(x: str, prompt: str = prompt) -> float:
            """x's lower interval end minus the control's upper end on this prompt: > 0 when they part."""
            return float(rates.loc[(prompt, x), "lo"] - rates.loc[(prompt, "control"), "hi"])

        check("reference_behaviour_above_control", prompt, "the prompt has an effect the check sees: the pass rate of "
              f"the model given the system prompt against the unprompted model's, {INTERVAL} ({where})",
              above_control("reference"), ">=", cfg.margin, measure="lo(prompted) − hi(control)")
        ratios = {x: ratio(kl[x].get(prompt, math.nan), kl["control"].get(prompt, math.nan)) for x in measured}
        for x in measured:
            check(f"{x}_kl_below_control", prompt, f"{METHOD_WORDS[x]}, fed held-out queries without the system "
                  "prompt: its mean next-token KL(prompted ‖ it) along the prompted model's greedy reply, over the "
                  f"unprompted model's (control); bar: kl_ratio= ({where})", ratios[x], "<=", cfg.kl_ratio,
                  measure=f"KL({x}) / KL(control)")
            check(f"{x}_behaviour_above_control", prompt, f"{METHOD_WORDS[x]}: the behaviour check's pass rate on its "
                  f"free greedy generations from held-out queries against the control's, {INTERVAL} ({where})",
                  above_control(x), ">=", cfg.margin, measure=f"lo({x}) − hi(control)")
            check(f"{x}_no_leak", prompt, f"{METHOD_WORDS[x]} never saw the prompt's tokens: on every held-out query "
                  "its KL to the prompted model is above what a rounding-level change of the prompted logits could "
                  f"make (½ (rounding bar · max |logit|)² a position); below it, it is the prompted model ({where})",
                  leak_decades(m, x, prompt), ">=", 0.0, measure=f"log10 min KL({x}) / rounding KL")
        if {"analytic", "bake"} <= set(measured):
            # a comparison between two methods means something only when both learned the prompt: a bake that
            # did nothing "beats" a harmful analytic patch, and a good bake "beats" a broken one; so the measure
            # is the largest of the three ratios held to the one bar, and passes only when all three do
            both = ratio(kl["bake"].get(prompt, math.nan), kl["analytic"].get(prompt, math.nan))
            worst = max(both, ratios["analytic"], ratios["bake"], key=lambda r: math.inf if math.isnan(r) else r)
            check("bake_kl_below_analytic", prompt, "training beats the construction on queries neither saw, both "
                  "below the control: the largest of the baked LoRA's mean held-out KL over the analytic patch's and "
                  f"each one's over the control's; bar: kl_ratio= ({where})", worst, "<=", cfg.kl_ratio,
                  measure="max KL ratio (bake/analytic, each/control)")
    reload = m[m["metric"] == "reload_logit_linf_rel"]
    if len(reload):
        dtype = str(m["dtype"].dropna().iloc[0])
        ctx.check("system_compile.checkpoint.reproduced", REF + " (checkpoint)",
                  "the saved checkpoint, reloaded by stock transformers, gives the logits of the compiled model the "
                  f"run measured, on the held-out queries: max |Δlogit| / max |logit| ({cfg.model}, {dtype})",
                  reload["value"].max(), "<=", rounding_bar(dtype), measure="relative logit L∞")
        same = m[m["metric"] == "reload_same_generation"]["value"]
        ctx.check("system_compile.checkpoint.same_generations", REF + " (checkpoint)",
                  "the reloaded checkpoint's free greedy generations from the held-out queries are the ones the run "
                  f"measured, token for token: fraction of queries ({cfg.model}, {dtype})", same.min(), ">=", 1.0,
                  measure="fraction identical")
    return verdicts


def pooled(m: pd.DataFrame, methods: list[str], verdicts: dict[str, dict[str, bool]]) -> list[tuple[str, float,
                                                                                                    dict]]:
    """The summary over prompts, never a claim: per claim kind how many prompts pass it (`prompts_passed`, of
    `prompts`), and per method the geometric mean over prompts of KL(method) / KL(control) (`kl_ratio_geomean`;
    0 when one prompt's KL is 0, NaN when a ratio is). (metric, value, index) rows for metrics.csv."""
    rows = [("prompts_passed", float(sum(v.values())), dict(claim=kind, prompts=len(v)))
            for kind, v in verdicts.items()]
    control = heldout_kl(m, "control")
    for x in methods:
        ratios = np.array([ratio(k, control.get(p, math.nan)) for p, k in heldout_kl(m, x).items()], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = float(np.exp(np.log(ratios).mean())) if len(ratios) else math.nan
        rows.append(("kl_ratio_geomean", mean, dict(method=x, prompts=len(ratios))))
    return rows
