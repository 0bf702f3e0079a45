"""Which run folders exist under a results folder, and which of them speaks for each experiment.

A run folder is a folder with run.json; a job of a multirun sweep (its parent has multirun.yaml)
belongs to that sweep, and a sweep counts as one run. Per experiment the newest complete run at the
highest preset is shown (paper > gpu > cpu > smoke), so that a later smoke sweep never hides a paper
run; why each one was taken is kept beside it for the reader. In the runs tables a sweep is one row per
model it ran (`run_rows`), not one per job: a 24-job Table 1 sweep over 6 models is 6 rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from experiments.core.run_folder import RUN_FILE

# Which run of an experiment speaks for it: the highest preset first, then the newest. A preset not named
# here (a user's own) ranks with cpu.
PRESET_RANK = {"smoke": 0, "cpu": 1, "gpu": 2, "paper": 3}
SMOKE = "smoke"
NOT_COMPLETE = ("interrupted", "running", "failed", "unknown")  # the order the summary counts them in


@dataclass
class Run:
    """One run folder (a single run, or one job of a sweep)."""

    path: Path
    experiment: str
    status: str  # complete / failed / interrupted / running / unknown
    start: str
    preset: str
    record: dict
    sweep: Path | None = None  # the multirun folder this job belongs to

    @property
    def model(self) -> str:
        """The model and its weights the claims were measured on ("gemma-3-270m (trained)"), where said."""
        return str(self.record.get("model") or "")

    @property
    def unit(self) -> Path:
        """What "newest run" picks among: a sweep as a whole, or the run itself."""
        return self.sweep or self.path


def rel(path: Path, root: Path) -> str:
    """`path` as the reader knows it: relative to the results folder when it is inside it."""
    try:
        return str(path.relative_to(root)) or "."
    except ValueError:
        return str(path)


def path_order(path: Path) -> tuple:
    """Sort key that puts a sweep's job 2 before its job 10: numeric parts compare as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts)


def find_runs(root: Path, problems: list[str]) -> list[Run]:
    """Every run folder under `root` (run.json next to it), with its sweep if its parent is a multirun."""
    runs = []
    for run_json in sorted(root.rglob(RUN_FILE), key=path_order):
        if ".hydra" in run_json.parts:
            continue
        folder = run_json.parent
        try:
            record = json.loads(run_json.read_text())
            experiment = record["experiment"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{rel(folder, root)}: run.json unreadable ({type(err).__name__}); run skipped")
            continue
        sweep = folder.parent if (folder.parent / "multirun.yaml").is_file() else None
        runs.append(Run(folder, experiment, str(record.get("status", "unknown")), str(record.get("start") or ""),
                        str(record.get("preset") or _preset_from_overrides(record)), record, sweep))
    return runs


def _preset_from_overrides(record: dict) -> str:
    for o in record.get("overrides") or []:
        if isinstance(o, str) and o.startswith("preset="):
            return o.split("=", 1)[1]
    return "paper"  # the default preset


def preset_rank(preset: str) -> int:
    return PRESET_RANK.get(preset, PRESET_RANK["cpu"])


def select_runs(runs: list[Run], all_runs: bool = False,
                reasons: dict[str, str] | None = None) -> tuple[list[Run], list[Run]]:
    """(complete runs to report, runs not complete to list as failed).

    Default: per experiment, among the units (runs or sweeps) with a complete run, the one at the highest
    preset (paper > gpu > cpu > smoke), the newest of those; its complete jobs are reported. A later smoke
    sweep does not displace a paper run. An experiment with no complete run lists its newest unit's runs as
    failed. `reasons` gets, per experiment, which run was taken and why."""
    if all_runs:
        return ([r for r in runs if r.status == "complete"], [r for r in runs if r.status != "complete"])
    chosen, failed = [], []
    for name in sorted({r.experiment for r in runs}):
        mine = [r for r in runs if r.experiment == name]
        units: dict[Path, list[Run]] = {}
        for r in mine:
            units.setdefault(r.unit, []).append(r)
        started = {u: max(r.start for r in rs) for u, rs in units.items()}
        complete = [u for u, rs in units.items() if any(r.status == "complete" for r in rs)]
        if complete:
            preset = {u: next(r.preset for r in units[u] if r.status == "complete") for u in complete}
            unit = max(complete, key=lambda u: (preset_rank(preset[u]), started[u]))
            chosen += [r for r in units[unit] if r.status == "complete"]
            failed += [r for r in units[unit] if r.status != "complete"]  # a sweep's failed jobs
            if reasons is not None:
                reasons[name] = _reason(unit, preset, started, complete, units)
        else:
            failed += units[max(units, key=started.__getitem__)]
    return chosen, failed


def _reason(unit: Path, preset: dict, started: dict, complete: list[Path], units: dict) -> str:
    """`preset=paper, started 2026-…: the highest preset with a complete run, the newest there; passed
    over: 1 newer smoke run` (what a reader needs to trust which numbers are shown)."""
    what = "sweep" if any(r.sweep for r in units[unit]) else "run"
    text = (f"{what} at preset={preset[unit]}, started {started[unit] or '?'}: the newest complete run at the "
            f"highest preset present (paper > gpu > cpu > smoke)")
    newer = [u for u in complete if u != unit and started[u] > started[unit]]
    if newer:
        by_preset: dict[str, int] = {}
        for u in newer:
            by_preset[preset[u]] = by_preset.get(preset[u], 0) + 1
        text += "; passed over: " + ", ".join(f"{n} newer {p} run(s)" for p, n in by_preset.items())
    return text


@dataclass
class RunRow:
    """One row of a runs table: a single run, or the jobs of one sweep that ran one model, with what else the
    sweep varied among them (`dtype: float32, bfloat16; variant: naive, closed_loop`)."""

    experiment: str
    where: Path  # the run folder, or the sweep's
    model: str
    preset: str
    jobs: list[Run] = field(default_factory=list)
    swept: dict[str, list[str]] = field(default_factory=dict)  # key -> its values among these jobs, in job order

    @property
    def devices(self) -> str:
        """`cpu float32` or, for jobs in several dtypes, `cpu float32, bfloat16`."""
        devices = dict.fromkeys(str(r.record.get("device") or "") for r in self.jobs)
        dtypes = dict.fromkeys(str(r.record.get("dtype") or "") for r in self.jobs)
        return f"{', '.join(d for d in devices if d)} {', '.join(d for d in dtypes if d)}".strip()

    @property
    def wall_s(self) -> float | None:
        """The jobs' wall times added up (what the row cost, whether its jobs ran one after another or not)."""
        walls = [r.record.get("wall_time_s") for r in self.jobs]
        return sum(float(w) for w in walls if w is not None) if any(w is not None for w in walls) else None

    @property
    def claims(self) -> str:
        """`passed/total` over the jobs, from their run.json (empty where none says)."""
        counted = [r.record for r in self.jobs if r.record.get("claims_total") is not None]
        if not counted:
            return ""
        passed = sum(int(c.get("claims_passed") or 0) for c in counted)
        return f"{passed}/{sum(int(c['claims_total']) for c in counted)}"


def _override_values(run: Run) -> dict[str, str]:
    """A run's command-line overrides as key -> value (Hydra's own keys left out)."""
    pairs = (str(o).split("=", 1) for o in run.record.get("overrides") or [] if "=" in str(o))
    return {k.lstrip("+~"): v for k, v in pairs if not k.startswith("hydra.")}


def run_rows(runs: list[Run]) -> list[RunRow]:
    """The runs as table rows: a single run is a row; a sweep's jobs make one row per model they ran (the
    row of Table 1), each naming the other keys the sweep varied and their values among its jobs. Rows in
    experiment order, then folder order."""
    rows: dict[tuple, RunRow] = {}
    for run in sorted(runs, key=lambda r: (r.experiment, path_order(r.path))):
        key = (run.experiment, run.unit, run.model if run.sweep else run.path)
        if key not in rows:
            rows[key] = RunRow(run.experiment, run.unit, run.model, run.preset)
        rows[key].jobs.append(run)
    by_sweep: dict[Path, list[Run]] = {}
    for run in runs:
        if run.sweep:
            by_sweep.setdefault(run.sweep, []).append(run)
    for row in rows.values():
        sweep = by_sweep.get(row.where) if row.jobs[0].sweep else None
        if not sweep:
            continue
        values = [_override_values(r) for r in sweep]
        varied = [k for k in dict.fromkeys(k for v in values for k in v) if len({v.get(k) for v in values}) > 1]
        for k in varied:
            if k == "model" and row.model:  # the row's own model, said in its Model cell
                continue
            row.swept[k] = list(dict.fromkeys(_override_values(r).get(k, "") for r in row.jobs))
    return list(rows.values())
