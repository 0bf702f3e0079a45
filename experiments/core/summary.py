"""What a run and a sweep print when they end: one line per claim, a summary of the claims and
where the files are, and for a sweep one line per job that did not complete."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

SMOKE_NOTE = ("preset=smoke runs a few steps to check the code, not the science: learning claims are "
              "expected to fail there; use preset=cpu or preset=paper for results")


def fmt(x: Any, digits: int = 3) -> str:
    """A number as compactly as it reads (%.3g): 0.00011920928955078125 -> 0.000119."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}g}"


def digits_to_resolve(values: list[Any], tolerance: Any) -> int:
    """Significant digits that show a difference of `tolerance` between numbers of the size of `values`
    (84.95 within 0.005 of 84.95 must not print as 85 within 0.005 of 85)."""
    try:
        size, tol = max(abs(float(v)) for v in values), abs(float(tolerance))
    except (TypeError, ValueError):
        return 3
    if not (math.isfinite(size) and math.isfinite(tol)) or size == 0 or tol == 0:
        return 3
    return max(3, min(12, math.ceil(math.log10(size / tol)) + 1))


def _measure(row: dict) -> str:
    """The claim's `measure` label, or "" (older claims.csv files and claims without one)."""
    label = row.get("measure")
    return label.strip() if isinstance(label, str) else ""


def claim_line(row: dict) -> str:
    """`PASS id: measured 3.2e-07 <= 1.19e-07` — the tolerance read the way its comparison uses it; with a
    `measure` label it says what the number is: `PASS id: log10(control L∞ / patched L∞) = 7 >= 1`."""
    verdict = "PASS" if row.get("passed") else "FAIL"
    measured = fmt(row.get("measured"))
    if "id" not in row:  # legacy rows: claim, source, paper_value, measured, tolerance, passed
        return f"claim {verdict} {row.get('claim')}: measured {measured} (tolerance {fmt(row.get('tolerance'))})"
    comparison, tolerance = row.get("comparison"), fmt(row.get("tolerance"))
    if comparison == "within":
        digits = digits_to_resolve([row.get("measured"), row.get("paper_value")], row.get("tolerance"))
        measured = fmt(row.get("measured"), digits)
        test = f"within {tolerance} of the paper's {fmt(row.get('paper_value'), digits)}"
    elif comparison == "<=":
        test = f"<= {tolerance} (bound)"
    else:
        test = f">= {tolerance} (bar to clear)"
    label = _measure(row)
    return f"claim {verdict} {row['id']}: {f'{label} =' if label else 'measured'} {measured} {test}"


def run_summary(run_dir: Path, claims: pd.DataFrame, wall_time_s: float, preset: str | None) -> list[str]:
    lines = []
    if len(claims):
        passed = int(claims["passed"].astype(bool).sum())
        failed = len(claims) - passed
        lines.append(f"claims: {passed} passed, {failed} failed (of {len(claims)}): {run_dir / 'claims.csv'}")
    else:
        lines.append("claims: none checked by this run")
    figures = sorted(p.name for p in (run_dir / "figures").glob("*.png")) if (run_dir / "figures").is_dir() else []
    lines.append(f"metrics: {run_dir / 'metrics.csv'}")
    if figures:
        lines.append(f"figures: {run_dir / 'figures'} ({', '.join(figures)})")
    lines.append(f"done in {wall_time_s:.1f} s: {run_dir}")
    if preset == "smoke" and len(claims) and not claims["passed"].astype(bool).all():
        lines.append(f"note: {SMOKE_NOTE}")
    return lines


def read_status(job_dir: Path) -> dict:
    """A job's run.json, or a stand-in when the job died before writing one."""
    try:
        return json.loads((job_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {"status": "failed", "error": "no run.json: the job died before its run started", "overrides": []}


def sweep_job_dirs(sweep_dir: Path) -> list[Path]:
    """Every job folder Hydra made in a sweep (complete or not), in job order."""
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and ((p / "run.json").exists() or (p / ".hydra").is_dir())]
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def _distinguishing(overrides: list[list[str]]) -> list[list[str]]:
    """Per job, the overrides not shared by every job (the sweep's own values: `seed=1`)."""
    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    return [[o for o in job if o not in common and not o.startswith("hydra.")] for job in overrides]


def sweep_summary(sweep_dir: Path) -> tuple[list[str], int]:
    """Lines to print at the end of a sweep, and how many jobs did not complete."""
    jobs = sweep_job_dirs(sweep_dir)
    records = [read_status(j) for j in jobs]
    labels = _distinguishing([list(r.get("overrides") or []) for r in records])
    bad = [(j, r, lab) for j, r, lab in zip(jobs, records, labels, strict=True) if r.get("status") != "complete"]
    lines = []
    for job, record, label in bad:
        why = record.get("error") or record.get("status")
        where = f" at {record['stopped_at']}" if record.get("stopped_at") else ""
        status = record.get("status")
        if status == "running":  # killed without a chance to say so (SIGKILL, out of memory)
            status, why = "failed", "the job's process died (run.json still says running)"
        lines.append(f"job {job.name} ({' '.join(label) or 'no overrides'}) {status}{where}: {why}")
    done = len(jobs) - len(bad)
    if bad:
        lines.append(f"{len(bad)} of {len(jobs)} jobs failed or were interrupted; {done} complete: {sweep_dir}")
    else:
        lines.append(f"all {len(jobs)} jobs complete: {sweep_dir}")
    complete = [(j, r, lab) for j, r, lab in zip(jobs, records, labels, strict=True) if r.get("status") == "complete"]
    tally = claim_tally(sweep_dir, complete)
    if tally:
        lines.append(tally)
    return lines, len(bad)


def claim_tally(sweep_dir: Path, complete: list[tuple[Path, dict, list[str]]]) -> str | None:
    """`claims: 9 passed, 3 failed over the 3 complete jobs (1 in job 0 (seed=0), ...): PATH`, from the
    counts each job's run.json holds; None when no complete job checked a claim."""
    counted = [(j, int(r["claims_passed"]), int(r["claims_total"]), lab) for j, r, lab in complete
               if r.get("claims_total") is not None and r.get("claims_passed") is not None]
    total = sum(t for _, _, t, _ in counted)
    if not total:
        return None
    passed = sum(p for _, p, _, _ in counted)
    jobs = f"the {len(counted)} complete job{'s' * (len(counted) != 1)}"
    failing = [f"{t - p} in job {j.name}{' (' + ' '.join(lab) + ')' if lab else ''}" for j, p, t, lab in counted
               if p < t]
    where = f" ({', '.join(failing)})" if failing else ""
    claims_file = sweep_dir / "claims.csv"
    return (f"claims: {passed} passed, {total - passed} failed over {jobs}{where}"
            f"{': ' + str(claims_file) if claims_file.is_file() else ''}")
