"""context_compile's claims: the fit exact where it was fitted (a construction, beside its perturbed control),
the held-out positions above the unpatched control (the evidence), the saved checkpoint reproduced. See run.py."""

from __future__ import annotations

import pandas as pd

from experiments.core.results import RunContext
from experiments.goldwaser.context_compile import ContextCompileConfig

REF = "Goldwaser §6 (extension): one fixed patch"
CONSTRUCTION = REF + " (construction: a least-squares fit checked where it was fitted)"
EXACT_DTYPES = ("float32", "float64")  # judged at rounding level (compare.ROUNDING); bfloat16 by top-1
BF16_FITTED_TOP1 = 0.9  # bfloat16: top-1 agreement at the fitted positions that counts as reproduced


def check_claims(cfg: ContextCompileConfig, ctx: RunContext, m: pd.DataFrame) -> None:
    """Claims that can fail, each from two independent computations (the with-context forward against a
    stock forward of the patched weights without context)."""
    from experiments.core.runtime import dtype_name
    from experiments.goldwaser.context_compile.measure import PERTURB, sweep_ks
    from experiments.patching.arch import adapter_for
    from experiments.patching.compare import rounding_bar

    dtype = dtype_name(ctx.dtype)
    rule = adapter_for(str(m["model_type"].dropna().iloc[0])).rule
    where = f"{cfg.model}, {dtype}"
    from experiments.goldwaser.record_claim import cached_claim

    cached_claim(ctx, m, dtype, cfg.model, "context_compile")  # the reply's cached logits against the uncached one
    pos = m[m["metric"].isin(["top1_match", "logit_linf_rel"])]
    fixed = pos[pos["method"] == "fixed"]
    for k in sweep_ks(cfg):
        if not rule.exact_at_k and k > 1:
            continue  # a bias or a scale cannot match k > 1 positions: its residual is reported (metrics)
        fk = fixed[(fixed["k"] == k) & (fixed["fitted"] == 1)]
        pk = pos[(pos["method"] == "perturbed") & (pos["k"] == k)]
        if dtype in EXACT_DTYPES:
            tol = rounding_bar(dtype)
            ctx.check(f"context_compile.construction.fit_exact_k{k}", CONSTRUCTION,
                      f"at the {k} fitted positions the fixed patch without context gives the with-context logits: "
                      f"max |Δlogit| / max |logit| over prompts and positions ({where}, {rule})",
                      fk[fk["metric"] == "logit_linf_rel"]["value"].max(), "<=", tol)
            ctx.check(f"context_compile.construction.fit_perturbed_k{k}_detected", CONSTRUCTION + " (control)",
                      f"the same check on the perturbed fit (every change x{PERTURB}) is not at rounding level "
                      f"({where}, {rule})", pk[pk["metric"] == "logit_linf_rel"]["value"].max(), ">=", tol)
        else:
            ctx.check(f"context_compile.construction.fit_top1_k{k}", CONSTRUCTION,
                      f"at the {k} fitted positions the fixed patch picks the with-context top-1 token, fraction "
                      f"({where}, {rule})", fk[fk["metric"] == "top1_match"]["value"].mean(), ">=", BF16_FITTED_TOP1)
    k, n = cfg.k, cfg.heldout
    held = pos[(pos["metric"] == "top1_match") & (pos["position"] >= k) & (pos["position"] < k + n)]
    fixed_held = held[(held["method"] == "fixed") & (held["k"] == k)]["value"]
    control_held = held[held["method"] == "control"]["value"]
    if len(fixed_held):
        ctx.check(f"context_compile.heldout.k{k}_above_control", REF,
                  f"over the {n} positions after the {k} fitted ones, top-1 agreement of the fixed patch "
                  f"minus the control's (unpatched, no context), fraction; bar: margin= ({where})",
                  fixed_held.mean() - control_held.mean(), ">=", cfg.margin)
    reload = m[m["metric"] == "reload_top1_match"]
    if len(reload):
        inproc = fixed[(fixed["k"] == k) & (fixed["prompt"] == 0) & (fixed["metric"] == "top1_match")]
        ctx.check("context_compile.checkpoint.reproduced", REF + " (checkpoint)",
                  f"the saved checkpoint, reloaded by stock transformers, gives the agreement measured in the "
                  f"run: |difference| of the top-1 agreement fractions over all positions ({where}, k={k})",
                  abs(reload["value"].mean() - inproc["value"].mean()), "<=", 0.0)
