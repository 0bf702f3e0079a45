"""layer_errors' claims, from its metrics alone (so a test can hand them a broken table and see them fail).

Each claim sets two independent computations against each other: the patched pass against the with-context
pass (hidden_rel), one variant against another on the same tokens, float64 against float32, the patched
layer against the original layer for the same δ, the patched model against the unpatched one.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

REF = "Goldwaser Alg. 1"
REF_APPB = "Goldwaser App. B / Thm 10"
EXACT = {"float64": 1e-12, "float32": 1e-5}  # max relative hidden error that counts as exact, per dtype
CONTROL_DECADES = 3.0  # naive's last-layer error at least 10^3 × the closed loop's: the exactness is not vacuous
SATURATION = 1e-2  # past this relative error the open loop is no longer a small perturbation: growth stops
FLOAT32_UNIT_ROUNDOFF = 2.0**-24
ALMOST_EXACT = 1e-2  # "almost exact": the last layer's relative error under 1 % when the first one is rounding
SAME_GROWTH = math.log10(3.0)  # float64 and float32 growth factors within 3×: the same amplification
SENSITIVITY_DECADES = 1.0  # a patched model's one-ulp sensitivity within 10× of the unpatched model's
AMPLIFY = math.log10(2.0)  # patched layers amplify at least 2× more than the original ones (geometric mean)


def _rows(m: pd.DataFrame, metric: str, dtype: str, variant: str) -> pd.DataFrame:
    return m[(m["metric"] == metric) & (m["dtype"] == dtype) & (m["variant"] == variant)]


def last_layer(m: pd.DataFrame, dtype: str, variant: str) -> pd.Series:
    """hidden_rel at the last layer, one value per (prompt, token)."""
    rows = _rows(m, "hidden_rel", dtype, variant)
    return rows[rows["layer"] == rows["layer"].max()]["value"]


def growth_per_layer(errors: np.ndarray, saturation: float = SATURATION) -> float:
    """Geometric mean of the per-layer growth of one token's open-loop error, (e_k / e_0)^(1/k), over the
    layers before it first reaches `saturation` (past it the error is O(1) and stops growing); NaN when
    fewer than two layers are below it or the first is exactly 0."""
    below = np.flatnonzero(errors >= saturation)
    k = (int(below[0]) if below.size else len(errors)) - 1
    if k < 1 or errors[0] <= 0:
        return float("nan")
    return float((errors[k] / errors[0]) ** (1.0 / k))


def median_growth(m: pd.DataFrame, dtype: str, variant: str = "naive") -> float:
    """The median over tokens of `growth_per_layer`."""
    rows = _rows(m, "hidden_rel", dtype, variant).sort_values("layer")
    per_token = [growth_per_layer(g["value"].to_numpy()) for _, g in rows.groupby(["prompt", "token"])]
    per_token = [g for g in per_token if not math.isnan(g)]
    return float(np.median(per_token)) if per_token else float("nan")


def sensitivity_ratio(m: pd.DataFrame, dtype: str, variant: str) -> float:
    """log10 of the median over tokens of (patched model's one-ulp sensitivity / the unpatched model's)."""
    keys = ["prompt", "token"]
    p = _rows(m, "one_ulp_patched", dtype, variant).set_index(keys)["value"]
    o = _rows(m, "one_ulp_original", dtype, variant).set_index(keys)["value"]
    ratio = (p / o.clip(lower=1e-300)).dropna()
    return math.log10(max(float(ratio.median()), 1e-300)) if len(ratio) else float("nan")


def gain_ratio(m: pd.DataFrame, dtype: str, variant: str) -> float:
    """log10 of the geometric mean over layers and tokens of gain(patched layer) / gain(original layer)."""
    keys = ["prompt", "token", "layer"]
    p = _rows(m, "gain_patched", dtype, variant).set_index(keys)["value"]
    o = _rows(m, "gain_original", dtype, variant).set_index(keys)["value"]
    ratio = (p / o).dropna()
    return float(np.log10(ratio.clip(lower=1e-300)).mean()) if len(ratio) else float("nan")


def check_claims(ctx, m: pd.DataFrame) -> None:
    dtypes = [d for d in ("float32", "float64") if d in set(m["dtype"])]
    variants = set(m["variant"])
    where = f"{m['model'].iloc[0]}" if "model" in m and len(m) else ""
    n_layers = int(m["layer"].max()) + 1 if "layer" in m and m["layer"].notna().any() else 0
    for dtype in dtypes:
        if "closed_loop" in variants:
            ctx.check(f"goldwaser.alg1.closed_loop_{dtype}_exact_every_layer", REF + " (closed loop)",
                      f"closed loop: max relative hidden error of the patched pass against the with-context pass, "
                      f"over every layer and token ({where}, {dtype})",
                      _rows(m, "hidden_rel", dtype, "closed_loop")["value"].max(), "<=", EXACT[dtype])
            if "naive" in variants:
                ratio = last_layer(m, dtype, "naive").median() / max(last_layer(m, dtype, "closed_loop").median(),
                                                                       1e-300)
                ctx.check(f"goldwaser.alg1.naive_{dtype}_last_layer_control", REF + " (control)",
                          f"the control: log10 of the open loop's median last-layer relative hidden error over the "
                          f"closed loop's, same tokens ({where}, {dtype})",
                          math.log10(max(ratio, 1e-300)), ">=", CONTROL_DECADES)
            ctx.check(f"goldwaser.alg1.closed_loop_{dtype}_one_ulp_sensitivity", REF_APPB + " (conditioned)",
                      f"closed loop with W_down conditioned: log10 of the median ratio of the patched model's "
                      f"one-ulp sensitivity (relative logit change) to the unpatched model's ({where}, {dtype})",
                      sensitivity_ratio(m, dtype, "closed_loop"), "<=", SENSITIVITY_DECADES)
        if "closed_loop_scale" in variants:
            ctx.check(f"goldwaser.alg1.closed_loop_scale_{dtype}_one_ulp_control", REF_APPB + " (control)",
                      f"the control: Thm 10 alone (divides by near-zero MLP outputs) makes the patched model more "
                      f"sensitive; log10 of its median one-ulp sensitivity ratio to the unpatched model's "
                      f"({where}, {dtype})", sensitivity_ratio(m, dtype, "closed_loop_scale"), ">=",
                      SENSITIVITY_DECADES)
    if "naive" not in variants:
        return
    if "float32" in dtypes:
        top1 = 100.0 * _rows(m, "top1_match", "float32", "naive")["value"].mean()
        ctx.check("goldwaser.alg1.naive_float32_top1_match", "Goldwaser §4.2 Fig 3",
                  f"Algorithm 1 (open loop) in float32 almost exact: the patched model's top-1 token agrees with "
                  f"the with-context model's, % of tokens (the paper: Gemma 3 1B) ({where})", top1, ">=", 100.0,
                  paper_value=100.0)
    if "float64" in dtypes and n_layers > 1:
        budget = (ALMOST_EXACT / FLOAT32_UNIT_ROUNDOFF) ** (1.0 / (n_layers - 1))
        ctx.check("goldwaser.alg1.naive_float64_growth_within_float32_budget", REF,
                  f"what the paper's float32 exactness implies: the open loop's per-layer error growth (float64, "
                  f"geometric mean before saturation, median over tokens) at most the factor that keeps float32 "
                  f"rounding under 1 % after all {n_layers} layers ({where})",
                  median_growth(m, "float64"), "<=", budget)
    if set(dtypes) == {"float32", "float64"}:
        ctx.check("goldwaser.alg1.naive_growth_same_in_float64_and_float32", REF,
                  f"the amplification is the algorithm's, not rounding's: |log10| of the ratio of the open loop's "
                  f"per-layer error growth in float64 to float32 ({where})",
                  abs(math.log10(median_growth(m, "float64") / median_growth(m, "float32"))), "<=", SAME_GROWTH)
    dtype = dtypes[-1]  # the gains agree across dtypes; the most precise one measures them best
    ctx.check(f"goldwaser.alg1.naive_{dtype}_patched_layers_amplify", REF,
              f"the open loop's patched layers amplify an input change more than the original layers: log10 of "
              f"the geometric mean over layers and tokens of their gain ratio, same x and δ ({where}, {dtype})",
              gain_ratio(m, dtype, "naive"), ">=", AMPLIFY)
    if "closed_loop" in variants:
        ctx.check(f"goldwaser.alg1.closed_loop_{dtype}_layers_amplify_as_original", REF_APPB + " (conditioned)",
                  f"the conditioned closed loop's patched layers amplify like the original ones: |log10| of the "
                  f"geometric mean of their gain ratio ({where}, {dtype})",
                  abs(gain_ratio(m, dtype, "closed_loop")), "<=", AMPLIFY)
