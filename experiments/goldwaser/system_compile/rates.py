"""Behaviour pass rates with their 95 % Wilson score interval: with 16 held-out replies one reply moves a rate by
0.06, so a claim compares interval ends (the method's lower end against the control's upper end), not points,
and per system prompt: its replies are the trials of one proportion. The row pooled over prompts ("all") is
for the summary table only; its replies are not independent trials of one proportion, so no claim reads it."""

from __future__ import annotations

import math

import pandas as pd

from experiments.core.intervals import wilson


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
