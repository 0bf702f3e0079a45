"""Reductions over a run's metric rows that a NaN cannot slip through.

pandas skips NaN by default: a token whose logits were NaN would vanish from the max a claim is judged by
(a NaN in one token's logits once read 2.5e-15). Here a NaN anywhere makes the result NaN, which fails the
claim (`RunContext.check`), and `where_nan` says which rows it came from, for the claim's description.
"""

from __future__ import annotations

import math

import pandas as pd

from experiments.core.plotting import metric

_WHERE = ("prompt", "step", "layer", "variant", "dtype")


def reduce_metric(frame: pd.DataFrame, name: str, how: str = "max") -> float:
    """`how` ("max", "min", "mean", "median") of metric `name`'s values; NaN if any value is NaN, or none
    was logged (a claim on nothing has shown nothing)."""
    values = frame.loc[frame["metric"] == name, "value"] if len(frame) else pd.Series(dtype=float)
    if values.empty:
        return math.nan
    return float(getattr(values, how)(skipna=False))


def where_nan(frame: pd.DataFrame, name: str) -> str:
    """"" when metric `name` has no NaN; else " (NaN at prompt 0 step 3, and 2 more)" naming the first row."""
    rows = metric(frame, name) if len(frame) else frame
    bad = rows[rows["value"].isna()] if "value" in rows else rows.iloc[0:0]
    if bad.empty:
        return ""
    first = bad.iloc[0]
    at = " ".join(f"{k} {int(first[k]) if isinstance(first[k], float) and first[k].is_integer() else first[k]}"
                  for k in _WHERE if k in bad.columns and pd.notna(first[k]))
    more = f", and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f" (NaN at {at or 'a row'}{more})"


def judged(frame: pd.DataFrame, name: str, how: str = "max") -> tuple[float, str]:
    """The reduction and where its NaN came from: `value, note = judged(m, "logit_linf_rel")`."""
    return reduce_metric(frame, name, how), where_nan(frame, name)
