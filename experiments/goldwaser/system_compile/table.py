"""The per-behaviour table of a run (summary.md in its folder): per system prompt and method, the held-out KL and
top-1 agreement, the behaviour rate with its 95 % Wilson interval, the fit KL, and what the compile cost (seconds,
rank, factored parameters): the table docs/system_compile.md shows, made from metrics.csv alone."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments.goldwaser.system_compile.rates import rate_table

SUMMARY_FILE = "summary.md"
ORDER = ("control", "analytic", "bake", "reference")  # the unprompted model first, the prompted one last
LABELS = {"control": "control (no prompt)", "reference": "prompted (reference)"}
COLUMNS = ["prompt", "method", "heldout_kl", "heldout_top1", "passes", "replies", "lo", "hi", "fit_kl", "compile_s",
           "rank", "params_factored"]


def summary_table(m: pd.DataFrame) -> pd.DataFrame:
    """One row per (prompt, method) in ORDER, prompts in the run's order, then the pooled behaviour rows
    (prompt "all"). Means over queries; a method's compile figures are its chosen point's (the budget sweep's
    other points, split=validation, are left out)."""
    measured = m[m["split"] != "validation"]
    rates = rate_table(m).set_index(["prompt", "method"])
    rows = []
    for prompt in dict.fromkeys(m["prompt"].dropna()):
        for method in ORDER:
            g = measured[(measured["prompt"] == prompt) & (measured["method"] == method)]
            if not len(g):
                continue
            row = dict(prompt=prompt, method=method)
            for column, metric, split in (("heldout_kl", "kl", "heldout"), ("heldout_top1", "top1", "heldout"),
                                          ("fit_kl", "kl", "fit")):
                values = g[(g["metric"] == metric) & (g["split"] == split)]["value"]
                row[column] = values.mean() if len(values) else math.nan
            for metric in ("compile_s", "rank", "params_factored"):
                values = g[(g["metric"] == metric) & g["split"].isna()]["value"]
                row[metric] = values.iloc[-1] if len(values) else math.nan
            if (prompt, method) in rates.index:
                row.update(rates.loc[(prompt, method), ["passes", "replies", "lo", "hi"]].to_dict())
            rows.append(row)
    for method in ORDER:  # the pooled rates, what the claims compare
        if ("all", method) in rates.index:
            rows.append(dict(prompt="all", method=method, **rates.loc[("all", method), ["passes", "replies", "lo",
                                                                                        "hi"]].to_dict()))
    return pd.DataFrame(rows, columns=COLUMNS)


def _number(x: float, digits: int = 3) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def markdown(table: pd.DataFrame) -> str:
    """The table as markdown, one line a row: what a results page pastes."""
    head = ("| system prompt | method | held-out KL (nats/token) | held-out top-1 | held-out behaviour, 95 % Wilson "
            "| fit KL | compile (s) | rank | params (factored) |")
    lines = [head, "|" + "---|" * 9]
    for r in table.itertuples(index=False):
        behaviour = ("" if isinstance(r.replies, float) and math.isnan(r.replies)
                     else f"{int(r.passes)}/{int(r.replies)} [{r.lo:.2f}, {r.hi:.2f}]")
        top1 = "" if math.isnan(r.heldout_top1) else f"{100 * r.heldout_top1:.1f} %"
        params = "" if math.isnan(r.params_factored) else f"{r.params_factored / 1e6:.1f} M"
        lines.append(f"| {r.prompt} | {LABELS.get(r.method, r.method)} | {_number(r.heldout_kl)} | {top1} | "
                     f"{behaviour} | {_number(r.fit_kl)} | {_number(r.compile_s)} | {_number(r.rank)} | {params} |")
    return "\n".join(lines) + "\n"


def pooled_lines(m: pd.DataFrame) -> list[str]:
    """The summary over prompts (claims.pooled: how many prompts pass each claim, the geometric mean of the KL
    ratios; a summary, never a claim) and, per prompt, how far its check agrees with the prompted model's own
    held-out replies (coherence.py), a miscalibrated one said so."""
    from experiments.goldwaser.system_compile.coherence import MISCALIBRATED

    lines = []
    for r in m[m["metric"] == "prompts_passed"].itertuples(index=False):
        lines.append(f"- `{r.claim}`: {int(r.value)} of {int(r.prompts)} system prompts pass")
    for r in m[m["metric"] == "kl_ratio_geomean"].itertuples(index=False):
        lines.append(f"- KL({r.method}) / KL(control), geometric mean over {int(r.prompts)} prompts: "
                     f"{_number(r.value)}")
    agree = m[m["metric"].isin(["check_agreement", "coherence_agreement"])]
    for prompt, g in agree.groupby("prompt", sort=False):
        values = g.set_index("metric")["value"]
        check, coherent = values.get("check_agreement", math.nan), values.get("coherence_agreement", math.nan)
        flag = " — **miscalibrated** for this model, or the model does not follow the prompt" \
            if check < 1 - MISCALIBRATED else ""
        lines.append(f"- {prompt}: the check passes {check:.0%} of the prompted model's own held-out replies "
                     f"(its likelihood threshold {coherent:.0%}){flag}")
    if not lines:
        return []
    return ["", "Pooled over prompts (a summary, not a claim), and each check against the prompted model's own "
            "replies:", "", *lines]


def write_summary(run_dir: Path) -> Path:
    """RUN_DIR/summary.md from RUN_DIR/metrics.csv (the run writes it at its end; this redoes it)."""
    from experiments.core.atomic import write_text_atomic
    from experiments.core.results import read_metrics

    path = Path(run_dir) / SUMMARY_FILE
    m = read_metrics(run_dir)
    write_text_atomic(path, markdown(summary_table(m)) + "\n".join(pooled_lines(m)) + "\n")
    return path


def page_table(folders: list[Path]) -> str:
    """docs/system_compile.md's table of a committed run (report/quoted.py's `table:` marker), from its
    metrics.csv alone: the per-behaviour table of its summary.md, without the pooled lines."""
    from experiments.core.errors import UserError
    from experiments.core.results import read_metrics

    if len(folders) != 1:
        raise UserError(f"the system_compile table reads one run, not {len(folders)}")
    return markdown(summary_table(read_metrics(Path(folders[0]))))


if __name__ == "__main__":  # a finished run's table again: python -m experiments.goldwaser.system_compile.table DIR
    import sys

    for folder in sys.argv[1:]:
        print(write_summary(Path(folder)).read_text(encoding="utf-8"))
