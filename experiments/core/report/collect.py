"""The claims of the chosen runs, read into one `Report`; bad input is a line under "Problems", not a crash.

An unreadable run.json, a corrupt or truncated claims.csv, or claims from an older version without ids
each become one line, and the rest is still reported: a report is most needed when something broke.
A claim that fails in a preset=smoke run is marked as expected there (smoke checks the code, not the
science) and is not counted by `--strict`, but for an exactness claim (`exact`), which no preset excuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from experiments.core import registry
from experiments.core.report.runs import NOT_COMPLETE, SMOKE, Run, find_runs, rel, select_runs
from experiments.core.results import CHECK_COLUMNS, CLAIM_COLUMNS
from experiments.core.run_folder import CLAIMS_FILE
from experiments.core.seeds import interval95, seeds_only

OTHER = "other"  # the paper group of runs whose experiment is no longer registered
CLAIMS_SHOWN = ["paper", "experiment", *CLAIM_COLUMNS, "run", "preset", "model", "job", "unit"]
SEED_SHOWN = ["over_seeds", "measured_lo", "measured_hi", "seeds"]  # a sweep over seeds only (fold_jobs)


@dataclass
class Report:
    root: Path
    claims: pd.DataFrame  # CHECK_COLUMNS + measure, paper, experiment, run, preset, job, unit: one row per job
    runs: list[Run]  # the runs whose claims are shown
    failed: list[Run]  # runs not complete (the newest per experiment without a complete one, or all with --all)
    missing: list[str]  # registered experiments with no run at all
    problems: list[str] = field(default_factory=list)
    found: list[Run] = field(default_factory=list)  # every run folder under root, whatever its status
    reasons: dict[str, str] = field(default_factory=dict)  # experiment -> which run was taken, and why

    @property
    def shown(self) -> pd.DataFrame:
        """The claims as shown: one row per claim of each run, a sweep's jobs folded into one (see fold_jobs)."""
        return fold_jobs(self.claims)

    @property
    def n_failed_claims(self) -> int:
        """Failed claims that count (for --strict): not those of preset=smoke runs, which are expected, but for
        exactness claims (`exact`), which hold on any weights and are never excused."""
        rows = self.shown
        return int((~rows["passed"] & ~rows["expected"]).sum()) if len(rows) else 0

    @property
    def n_expected_failures(self) -> int:
        rows = self.shown
        return int(rows["expected"].sum()) if len(rows) else 0

    def not_complete_counts(self) -> dict[str, int]:
        """How many of all the runs found are not complete, by status (interrupted, running, failed, ...)."""
        counts: dict[str, int] = {}
        for r in self.found:
            if r.status != "complete":
                key = r.status if r.status in NOT_COMPLETE else "unknown"
                counts[key] = counts.get(key, 0) + 1
        return {k: counts[k] for k in NOT_COMPLETE if k in counts}


def fold_jobs(claims: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, run or sweep, claim id): a sweep's jobs folded, measured_min / measured_max
    over them, passed only if every job passed, `jobs` and `jobs_passed` counted; `expected` marks a
    failure of a preset=smoke run (expected there, not counted by --strict) but an exactness claim's."""
    columns = [*CLAIMS_SHOWN, "measured_min", "measured_max", "jobs", "jobs_passed", "expected", *SEED_SHOWN]
    if claims.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for _, group in claims.groupby(["experiment", "unit", "id"], sort=False):
        first = group.iloc[0].to_dict()
        passed = bool(group["passed"].all())
        first.update(measured_min=group["measured"].min(), measured_max=group["measured"].max(),
                     jobs=len(group), jobs_passed=int(group["passed"].sum()), passed=passed,
                     expected=not passed and first["preset"] == SMOKE and not bool(first.get("exact")),
                     job=",".join(j for j in group["job"] if j),
                     model=", ".join(dict.fromkeys(m for m in group["model"] if m)))  # a sweep's models, once
        if bool(group.get("over_seeds", pd.Series([False])).iloc[0]) and len(group) > 1:  # core/seeds.py
            mean, lo, hi = interval95([float(v) for v in group["measured"]])
            quorum = group["seed_quorum"].iloc[0]
            first.update(measured=mean, measured_lo=lo, measured_hi=hi, over_seeds=True,
                         seeds=",".join(str(s) for s in group["seed"]),
                         passed=first["jobs_passed"] >= math.ceil(quorum * len(group) - 1e-9))
            first["expected"] = not first["passed"] and first["preset"] == SMOKE and not bool(first.get("exact"))
        rows.append(first)
    return pd.DataFrame(rows).reindex(columns=columns)  # the seed columns only where a sweep is over seeds


def read_run_claims(run: Run, root: Path, problems: list[str]) -> pd.DataFrame | None:
    """The run's claims with the contract's columns, or None (with one line in `problems`) when unusable."""
    path = run.path / CLAIMS_FILE
    where = rel(run.path, root)
    if not path.is_file():
        return None  # an experiment may check no claim; not a problem
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        problems.append(f"{where}: claims.csv is corrupt or truncated ({type(err).__name__}); its claims are left out")
        return None
    if "id" not in frame.columns and "claim" in frame.columns:
        problems.append(f"{where}: claims.csv is from an older version without claim ids "
                        f"({len(frame)} claims left out; re-run the experiment)")
        return None
    lacking = [c for c in CHECK_COLUMNS if c not in frame.columns]
    if lacking:
        problems.append(f"{where}: claims.csv is corrupt (no {', '.join(lacking)} column); its claims are left out")
        return None
    if "measure" not in frame.columns:  # written before claims said what their number is
        frame["measure"] = ""
    if "exact" not in frame.columns:  # written before exactness claims were told apart
        frame["exact"] = False
    frame = frame[CLAIM_COLUMNS].copy()
    frame["exact"] = frame["exact"].astype(str) == "True"
    frame["measure"] = frame["measure"].fillna("").astype(str)
    broken = frame["id"].isna() | frame["passed"].isna() | ~frame["passed"].astype(str).isin(["True", "False"])
    broken |= ~frame["comparison"].isin(["<=", ">=", "within"])
    if broken.any():
        problems.append(f"{where}: claims.csv has {int(broken.sum())} truncated or malformed row(s); left out")
        frame = frame[~broken]
    frame["passed"] = frame["passed"].astype(str) == "True"
    for col in ("paper_value", "measured", "tolerance"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def build_report(root: Path, all_runs: bool = False) -> Report:
    """Walk `root`, choose the runs (runs.select_runs; every run with `all_runs`) and read their claims."""
    root = Path(root)
    problems: list[str] = []
    runs = find_runs(root, problems) if root.is_dir() else []
    if not root.is_dir():
        problems.append(f"{root}: no such folder")
    elif not runs:
        problems.append(f"{root}: no run folders (run.json) found")
    reasons: dict[str, str] = {}
    chosen, failed = select_runs(runs, all_runs, reasons)
    over_seeds = _seed_sweeps(runs)
    frames = []
    for run in chosen:
        claims = read_run_claims(run, root, problems)
        if claims is None or claims.empty:
            continue
        claims.insert(0, "experiment", run.experiment)
        claims.insert(0, "paper", paper_of(run.experiment))
        claims["run"] = rel(run.path, root)
        claims["preset"] = run.preset
        claims["model"] = run.model
        claims["job"] = run.path.name if run.sweep else ""
        claims["unit"] = rel(run.unit, root)
        claims["seed"] = run.record.get("seed")
        claims["over_seeds"] = run.unit in over_seeds
        claims["seed_quorum"] = getattr(_registered(run.experiment), "seed_quorum", 1.0)
        frames.append(claims)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CLAIMS_SHOWN)
    seen = {r.experiment for r in runs}
    missing = [n for n in registry.experiment_names() if n not in seen]
    return Report(root, table, chosen, failed, missing, problems, found=runs, reasons=reasons)


def _seed_sweeps(runs: list[Run]) -> set[Path]:
    """The sweeps whose jobs all completed and differ only by seed: their claims are shown as one row each,
    the mean and its 95 % interval over the seeds (core/seeds.py), as the sweep's own claims.csv has them."""
    by_sweep: dict[Path, list[Run]] = {}
    for run in runs:
        if run.sweep:
            by_sweep.setdefault(run.sweep, []).append(run)
    return {sweep for sweep, jobs in by_sweep.items() if all(r.status == "complete" for r in jobs)
            and seeds_only([list(r.record.get("overrides") or []) for r in jobs])}


def _registered(name: str):
    try:
        return registry.get(name)
    except Exception:  # an experiment that is no longer registered
        return None


def paper_of(experiment: str) -> str:
    """The paper package of an experiment, or OTHER for one that is no longer registered."""
    try:
        return registry.paper_package(experiment)
    except Exception:  # an experiment that is no longer registered
        return OTHER
