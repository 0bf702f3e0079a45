"""system_compile's claims, each from two independent computations on the HELD-OUT queries: a compiled
model's forward without the system prompt, against the unprompted model's (the control) or the other
method's, both measured against the prompted model's own distributions. The directions are the ones
expected before measuring (bake below the control and below the analytic patch, analytic below the
control); what fails is reported as measured. The fit queries' numbers stay in metrics.csv: for the analytic
patch they are a construction (least squares at those very positions)."""

from __future__ import annotations

import pandas as pd

from experiments.core.results import RunContext
from experiments.goldwaser.system_compile.rates import pooled, rate_table
from experiments.goldwaser.system_compile.schema import SystemCompileConfig
from experiments.patching.compare import rounding_bar

REF = "beyond the papers: a system prompt compiled into weights (Goldwaser §6; Prompt Baking)"
METHOD_WORDS = {"analytic": "the analytic fixed patch (least squares over the fit queries' positions)",
                "bake": "the baked LoRA (trained on KL over the fit queries' continuations)"}


def heldout_mean(m: pd.DataFrame, method: str, metric: str) -> float:
    """Mean over system prompts of the mean over held-out queries (each prompt weighs the same)."""
    rows = m[(m["method"] == method) & (m["metric"] == metric) & (m["split"] == "heldout")]
    return float(rows.groupby("prompt")["value"].mean().mean()) if len(rows) else float("nan")


def check_claims(cfg: SystemCompileConfig, ctx: RunContext, m: pd.DataFrame) -> None:
    measured = [str(m) for m in cfg.methods]
    prompts = int(m.loc[m["metric"] == "kl", "prompt"].nunique())
    held = int(m.loc[(m["metric"] == "kl") & (m["split"] == "heldout"), "query"].nunique())
    where = f"{cfg.model}, {prompts} system prompt{'s' * (prompts != 1)}, {held} held-out queries"
    ratio, margin = cfg.kl_ratio, cfg.margin
    kl = {x: heldout_mean(m, x, "kl") for x in ("control", *measured)}
    table = rate_table(m)
    control = pooled(table, "control")

    def above_control(x: str) -> float:
        """The lower end of x's 95 % Wilson interval minus the upper end of the control's: > 0 when they part."""
        return float(pooled(table, x)["lo"] - control["hi"])

    interval = ("pooled over prompts, 95 % Wilson intervals: lower end of the one minus upper end of the "
                "control's; bar: margin=")
    ctx.check("system_compile.heldout.reference_behaviour_above_control", REF,
              "the prompt has an effect the check sees: on held-out queries, the pass rate of the model given the "
              f"system prompt against the unprompted model's, {interval} ({where})", above_control("reference"),
              ">=", margin, measure="lo(prompted) − hi(control)")
    for x in measured:
        ctx.check(f"system_compile.heldout.{x}_kl_below_control", REF,
                  f"{METHOD_WORDS[x]}, fed held-out queries without the system prompt: its mean next-token "
                  "KL(prompted ‖ it) along the prompted model's greedy reply, over the unprompted model's (control); "
                  f"bar: kl_ratio= ({where})", kl[x] / kl["control"], "<=", ratio, measure=f"KL({x}) / KL(control)")
        ctx.check(f"system_compile.heldout.{x}_behaviour_above_control", REF,
                  f"{METHOD_WORDS[x]}: the behaviour check's pass rate on its free greedy generations from held-out "
                  f"queries against the control's, {interval} ({where})", above_control(x), ">=", margin,
                  measure=f"lo({x}) − hi(control)")
    if {"analytic", "bake"} <= set(measured):
        # a comparison between two methods means something only when both learned the prompt: a bake that
        # did nothing "beats" a harmful analytic patch, and a good bake "beats" a broken one
        # so the measure is the largest of the three ratios held to the one bar: KL(bake) / KL(analytic), and
        # each method's KL over the control's; it passes only when all three do, and stays a finite number
        worst = max(kl["bake"] / kl["analytic"], kl["analytic"] / kl["control"], kl["bake"] / kl["control"])
        ctx.check("system_compile.heldout.bake_kl_below_analytic", REF,
                  "training beats the construction on queries neither saw, both below the control: the largest of "
                  "the baked LoRA's mean held-out KL over the analytic patch's and each one's over the control's; "
                  f"bar: kl_ratio= ({where})", worst, "<=", ratio,
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
