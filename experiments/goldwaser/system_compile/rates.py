"""Behaviour pass rates with their 95 % Wilson score interval: with 16 held-out replies one reply moves a rate by
0.06, so a claim compares interval ends (the method's lower end against the control's upper end), not points."""

from __future__ import annotations

import math

import pandas as pd

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials; (nan, nan) for n = 0."""
    if n <= 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_table(m: pd.DataFrame, split: str = "heldout") -> pd.DataFrame:
    """Per (prompt, method): passes, replies, rate and its interval, from the per-query `behaviour` rows;
    prompt "all" pools every prompt's replies."""
    rows = m[(m["metric"] == "behaviour") & (m["split"] == split)]
    out = []
    for prompt, group in [*rows.groupby("prompt"), ("all", rows)]:
        for method, g in group.groupby("method"):
            k, n = float(g["value"].sum()), int(len(g))
            lo, hi = wilson(k, n)
            out.append(dict(prompt=prompt, method=method, passes=int(k), replies=n, rate=k / n if n else math.nan,
                            lo=lo, hi=hi))
    return pd.DataFrame(out, columns=["prompt", "method", "passes", "replies", "rate", "lo", "hi"])


def pooled(table: pd.DataFrame, method: str) -> pd.Series:
    """The pooled row (every prompt's held-out replies) of `method`; NaNs when it has none."""
    rows = table[(table["prompt"] == "all") & (table["method"] == method)]
    if not len(rows):
        return pd.Series(dict(passes=0, replies=0, rate=math.nan, lo=math.nan, hi=math.nan))
    return rows.iloc[0]
