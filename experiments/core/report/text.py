"""What every rendering (report.md, report.html, docs/results.md) says about a claim, a run or a paper.

Kept apart from the renderings so that report.md, report.html and docs/results.md never disagree on a
number's digits, on what counts as passed, or on which runs and figures belong to which paper.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments.core import registry
from experiments.core.report.collect import OTHER, Report, paper_of
from experiments.core.report.runs import Run
from experiments.core.run_folder import FIGURES_DIR

CLAIM_HEADER = ["Claim", "Ref", "Paper", "Measured", "Tolerance", "Result", "Run", "Preset", "Model"]


def fmt(value) -> str:
    """Numbers the way a reader wants them: 3 significant digits, nothing for empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{float(value):.3g}"


def criterion(row) -> str:
    """'≤ 1.19e−05', '≥ 3', 'within ±0.1'."""
    if row["comparison"] == "within":
        return f"within ±{fmt(row['tolerance'])}"
    return {"<=": "≤ ", ">=": "≥ "}[row["comparison"]] + fmt(row["tolerance"])


def _measured(row) -> str:
    """One run's value, a sweep's range over its jobs: `0.12 … 0.47 (3 jobs)`, or over seeds the mean and its
    95 % interval: `0.904 [0.892, 0.916] (95 %, 3 seeds)`."""
    if row.get("over_seeds") is True:
        return f"{fmt(row['measured'])} [{fmt(row['measured_lo'])}, {fmt(row['measured_hi'])}] (95 %, " \
               f"{row['jobs']} seeds)"
    if row.get("jobs", 1) > 1:
        lo, hi = fmt(row["measured_min"]), fmt(row["measured_max"])
        return (lo if lo == hi else f"{lo} … {hi}") + f" ({row['jobs']} jobs)"
    return fmt(row["measured"])


def result_text(row, bold: str = "**") -> str:
    """pass / FAIL / FAIL (1 of 3 jobs) / fail (expected at preset=smoke)."""
    jobs = row.get("jobs", 1)
    seeds = f" ({row['jobs_passed']}/{jobs} seeds)" if row.get("over_seeds") is True else ""
    if row["passed"]:
        return "pass" + seeds
    if row.get("expected"):
        return f"fail{seeds} (expected at smoke)"
    if seeds:
        return f"{bold}FAIL{bold}{seeds}"
    return f"{bold}FAIL{bold}" + (f" ({jobs - row['jobs_passed']} of {jobs} jobs)" if jobs > 1 else "")


def claim_cells(row) -> list[str]:
    """A shown claim's cells, in CLAIM_HEADER order."""
    run = row["unit"] if row.get("jobs", 1) > 1 else row["run"] + (f" (job {row['job']})" if row["job"] else "")
    measure = row.get("measure") or ""
    measured = _measured(row) + (f" = {measure}" if measure else "")
    return [f"`{row['id']}`", row["ref"], fmt(row["paper_value"]), measured, criterion(row),
            result_text(row), run, row["preset"], row.get("model") or ""]


CONSTRUCTION_NOTE = ("Construction: a procedure that solves for the very output it is compared with agrees by "
                     "design (the closed loop: one layer's patches can force any output); these claims stand "
                     "beside the control that agrees as well, and are no evidence for the paper.")


def is_construction(claim_id: str) -> bool:
    """Claims whose ids say `construction` (goldwaser.construction.*, context_compile.construction.*)."""
    return ".construction." in str(claim_id)


def split_construction(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the evidence claims, the construction claims): a report shows the second apart, after the first."""
    built = rows["id"].map(is_construction) if len(rows) else pd.Series(dtype=bool)
    return rows[~built], rows[built]


def summary_line(rows: pd.DataFrame) -> str:
    """`3/4 claims passed` (+ how many of the failures are preset=smoke's expected ones)."""
    passed = int(rows["passed"].sum()) if len(rows) else 0
    expected = int(rows["expected"].sum()) if len(rows) and "expected" in rows else 0
    smoke = f" ({expected} failed as expected at preset=smoke, not counted by --strict)" if expected else ""
    return f"{passed}/{len(rows)} claims passed{smoke}"


def runs_line(report: Report) -> str:
    """The summary's second half: runs shown, runs not complete among all found (by status), never run."""
    counts = report.not_complete_counts()
    detail = f" ({', '.join(f'{n} {status}' for status, n in counts.items())})" if counts else ""
    return (f"over {len(report.runs)} run(s) shown; {sum(counts.values())} of the {len(report.found)} run(s) found "
            f"not complete{detail}; {len(report.missing)} experiment(s) never run.")


def run_state(run: Run) -> str:
    """A run that is not complete, as the reader needs it: its status and the error it died of."""
    error = run.record.get("error")
    status = "running (or died without saying so)" if run.status == "running" else run.status
    return status + (f" ({error})" if error else "")


# -- which paper a thing belongs to ------------------------------------------------------------------


def paper_groups(report: Report) -> list[tuple[str, str, pd.DataFrame]]:
    """(package, title, claims) per paper with runs or registered experiments, in PAPER_PACKAGES order."""
    titles = _paper_titles()
    packages = list(registry.PAPER_PACKAGES)
    shown = report.shown
    if (shown["paper"] == OTHER).any():
        packages.append(OTHER)
    return [(package, titles.get(package, package), shown[shown["paper"] == package]) for package in packages]


def _paper_titles() -> dict[str, str]:
    titles = {}
    for exp in registry.all_experiments():
        titles.setdefault(registry.paper_package(exp.name), exp.paper)
    return titles


def figures_of(name: str) -> str:
    """The paper's figures an experiment reproduces ("Fig. 2"), as a heading shows them (Experiment.figures_label),
    or nothing for an unregistered one."""
    try:
        return registry.get(name).figures_label
    except Exception:
        return ""


def runs_of(report: Report, package: str) -> list[Run]:
    return [r for r in report.runs if paper_of(r.experiment) == package]


def not_run(report: Report, package: str) -> tuple[list[Run], list[str]]:
    """A paper's runs that are not complete, and its experiments with no run at all."""
    failed = [r for r in report.failed if paper_of(r.experiment) == package]
    missing = [n for n in report.missing if paper_of(n) == package]
    return failed, missing


def has_content(report: Report, package: str, rows: pd.DataFrame) -> bool:
    """Whether a paper gets a section: it has claims, runs, or experiments that did not run."""
    failed, missing = not_run(report, package)
    return not rows.empty or bool(failed or missing or runs_of(report, package))


def figure_files(report: Report, package: str) -> list[tuple[str, Path]]:
    """(experiment, png) for the shown runs: a sweep's combined figures once, else each run's."""
    out, seen = [], set()
    for run in runs_of(report, package):
        folder = run.sweep if run.sweep and (run.sweep / FIGURES_DIR).is_dir() else run.path
        if folder in seen:
            continue
        seen.add(folder)
        out += [(run.experiment, p) for p in sorted((folder / FIGURES_DIR).glob("*.png"))]
    return out
