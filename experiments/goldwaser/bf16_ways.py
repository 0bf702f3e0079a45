"""docs/goldwaser.md's bfloat16 table and figure from finished patch_match / gemma_match runs: one row per model ×
dtype × variant × apply × advance (`patch_match/plots.py`'s `ways_table`), the figure one panel per model.

    python -m experiments.goldwaser.bf16_ways SWEEP_DIR [SWEEP_DIR ...] [--figures DIR]

prints the Markdown table and writes bf16_ways.png/.pdf into --figures (default: the current folder). Reads only
the runs' metrics.csv: nothing is recomputed."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from experiments.core.errors import UserError
from experiments.goldwaser.patch_match.plots import ways_figure, ways_table

MODEL_ORDER = ("gemma-3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b")
DTYPE_ORDER = ("float64", "float32", "bfloat16")
COLUMNS = ("model", "dtype", "variant", "apply", "advance", "top-1", "% [95 % CI]", "max rel. logit L∞", "median TVD",
           "max hidden rel.", "median margin", "largest margin at a miss")


def load(folders: list[Path]) -> pd.DataFrame:
    """Every run's metrics (metrics.csv or .csv.gz) under the folders (a sweep's jobs, or a single run)."""
    from experiments.core.results import read_metrics

    runs = sorted({f.parent for folder in folders for pattern in ("metrics.csv", "metrics.csv.gz")
                   for f in Path(folder).rglob(pattern)})
    if not runs:
        raise UserError(f"no metrics.csv under {', '.join(map(str, folders))}")
    return pd.concat([read_metrics(run) for run in runs], ignore_index=True)


def page_table(folders: list[Path]) -> str:
    """docs/goldwaser.md's table, from the committed runs (report/quoted.py's `table:` marker)."""
    return markdown(ways_table(load(folders)))


def _g(value: float) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2g}"


def markdown(table: pd.DataFrame) -> str:
    def rank(column: pd.Series) -> pd.Series:
        order = {"model": MODEL_ORDER, "dtype": DTYPE_ORDER}.get(column.name)
        return column.map(lambda v: order.index(v) if v in order else len(order)) if order else column

    t = table.sort_values(["model", "dtype", "variant", "apply", "advance"], key=rank)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in t.to_dict("records"):
        cells = [r["model"], r["dtype"], r["variant"], r.get("apply", ""), r.get("advance", ""),
                 f"{r['matches']}/{r['tokens']}",
                 f"{r['top1_pct']:.1f} [{r['top1_lo_pct']:.1f}, {r['top1_hi_pct']:.1f}]",
                 _g(r["max_rel_linf"]), _g(r["median_tvd"]), _g(r["max_hidden_rel"]), _g(r.get("median_margin")),
                 _g(r.get("max_margin_at_misses"))]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.goldwaser.bf16_ways", description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--figures", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    try:
        metrics = load(args.folders)
    except UserError as err:
        raise SystemExit(str(err)) from None
    print(markdown(ways_table(metrics)))
    for path in ways_figure(metrics, args.figures):
        print(path)


if __name__ == "__main__":
    main()
