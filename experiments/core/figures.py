"""Re-render figures from finished runs, and combine the jobs of a multirun.

A run folder holds run.json + metrics.csv; a multirun folder holds Hydra's multirun.yaml and one
run folder per job. Combining concatenates the jobs' tidy metrics (their run_id and index columns
keep them apart) and hands the result to the same plot function a single run uses.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from experiments.core import registry
from experiments.core.errors import UserError
from experiments.core.plotting import figure_caption
from experiments.core.results import CLAIM_COLUMNS, metrics_path, read_claims, read_metrics, write_csv_atomic
from experiments.core.run_folder import CLAIMS_FILE, FIGURES_DIR, METRICS_FILE, RUN_FILE
from experiments.core.seeds import aggregate_claims, plot_claims_over_seeds, seeds_only

log = logging.getLogger(__name__)


def is_run_dir(path: Path) -> bool:
    return (path / RUN_FILE).is_file() and metrics_path(path) is not None


def job_dirs(path: Path) -> list[Path]:
    """The job folders of a multirun folder (any child that is a run), in job order."""
    if not path.is_dir():
        return []
    jobs = [p for p in path.iterdir() if p.is_dir() and is_run_dir(p)]
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def experiment_of(run_dir: Path) -> str:
    return json.loads((run_dir / RUN_FILE).read_text())["experiment"]


def run_state(run_dir: Path) -> str:
    """'complete', or what else run.json says, e.g. 'failed (RuntimeError: ...)', 'interrupted at train 3/30'."""
    record = json.loads((run_dir / RUN_FILE).read_text())
    status = record.get("status", "unknown")
    if status == "complete":
        return status
    where = f" at {record['stopped_at']}" if record.get("stopped_at") else ""
    why = f" ({record['error']})" if record.get("error") and status == "failed" else ""
    return f"{status}{where}{why}"


def completed_jobs(sweep_dir: Path) -> list[Path]:
    return [j for j in job_dirs(sweep_dir) if run_state(j) == "complete"]


def _drawn(paths: list[Path], what: Path) -> list[Path]:
    if not paths:
        raise UserError(f"nothing to draw: the metrics of {what} hold none of the rows its figures need")
    return paths


def _record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}


def figure_title(exp: registry.Experiment, metrics: pd.DataFrame, records: list[dict]) -> str:
    """`linreg_icl · Dherin et al. Fig. 2 · preset=cpu` (+ the models, + `sweep of N runs`): what a figure
    shows, on the figure itself."""
    name, paper, figures = (getattr(exp, key, "") for key in ("name", "paper", "figures"))
    parts = [p for p in (name, f"{paper} {figures}".strip()) if p]
    presets = sorted({str(r.get("preset")) for r in records if r.get("preset")})
    if presets:
        parts.append(f"preset={','.join(presets)}")
    if "model" in metrics.columns:
        models = sorted({str(m) for m in metrics["model"].dropna().unique()})
        if models:
            parts.append(f"model={','.join(models[:4])}{' …' if len(models) > 4 else ''}")
    if len(records) > 1:
        parts.append(f"sweep of {len(records)} runs")
    return " · ".join(parts)


def source_of(tables: list[Path]) -> str:
    """What a figure's PNG says it was drawn from: the table's path as given (relative to where the command
    ran: `results/linreg_icl/paper/metrics.csv`), a sweep's jobs as one pattern (`.../gemma-3-270m/*/metrics.csv`)."""
    tables = [_from_here(t) for t in tables]
    if len(tables) == 1:
        return tables[0].as_posix()
    parents = {t.parent.parent for t in tables}
    names = {t.name for t in tables}
    if len(parents) == 1 and len(names) == 1:
        return (parents.pop() / "*" / names.pop()).as_posix()
    return ";".join(t.as_posix() for t in tables)


def _from_here(path: Path) -> Path:
    """`path` relative to the working folder when it lies below it (a figure drawn from the repository's
    results/ names `results/...`, wherever the checkout is), else as it is."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def _plot(exp: registry.Experiment, metrics: pd.DataFrame, figures_dir: Path, run_dirs: list[Path]) -> list[Path]:
    """exp.plot, with a run written by an older layout (a column its figures read is missing) said in one line
    that names the commit that wrote it."""
    if not getattr(exp, "draws_figures", True):
        raise UserError(f"{exp.name} draws no figures ({exp.figures.strip('()')}): nothing to plot")
    try:
        return exp.plot(metrics, figures_dir)
    except KeyError as missing:
        record = _record(run_dirs[0])
        commit = str((record.get("git") or {}).get("commit") or "unknown")[:7]
        raise UserError(f"{run_dirs[0]}: its metrics have no column {missing} that {exp.name}'s figures read: it "
                        f"was written by commit {commit} ({str(record.get('start', ''))[:10]}) in an older layout; "
                        f"run it again to redraw it") from None


def render_run(run_dir: Path, exp: registry.Experiment | None = None) -> list[Path]:
    exp = exp or registry.get(experiment_of(run_dir))
    if not getattr(exp, "draws_figures", True):  # the runner draws every run's figures: none here, no error
        return []
    metrics = read_metrics(run_dir)
    with figure_caption(figure_title(exp, metrics, [_record(run_dir)]), source=source_of([metrics_path(run_dir)])):
        return _plot(exp, metrics, run_dir / FIGURES_DIR, [run_dir])


def _render_incomplete_run(run_dir: Path) -> list[Path]:
    """`icl-exp plot` on a run that did not complete: draw what it measured, and say so (on the figure too)."""
    state = run_state(run_dir)
    if state == "running":
        state = "running (or its process died)"
    metrics = read_metrics(run_dir)
    if metrics.empty:
        raise UserError(f"{run_dir} is {state} and measured nothing: no figure to draw")
    log.warning("%s is %s: drawing what it measured, the figures are incomplete", run_dir, state)
    exp = registry.get(experiment_of(run_dir))
    warning = f"INCOMPLETE: the run is {state}; this is what it measured until then"
    with figure_caption(figure_title(exp, metrics, [_record(run_dir)]), warning, source_of([metrics_path(run_dir)])):
        return _drawn(_plot(exp, metrics, run_dir / FIGURES_DIR, [run_dir]), run_dir)


def render_multirun(sweep_dir: Path, warn: bool = True) -> list[Path]:
    finished = job_dirs(sweep_dir)
    jobs = [j for j in finished if run_state(j) == "complete"]
    if not jobs:
        states = "; ".join(f"job {j.name}: {run_state(j)}" for j in finished)
        raise UserError(f"{sweep_dir} holds no completed jobs to combine ({states or 'no jobs'})")
    for j in finished:
        if j not in jobs and warn:  # a failed or interrupted job's partial metrics would skew the combination
            log.warning("job %s is %s: left out of the combined figures and claims", j.name, run_state(j))
    names = {experiment_of(j) for j in jobs}
    if len(names) != 1:
        raise UserError(f"{sweep_dir} mixes experiments {sorted(names)}; plot them one by one")
    exp = registry.get(names.pop())
    metrics = pd.concat([read_metrics(j) for j in jobs], ignore_index=True)
    claims = []
    for j in jobs:
        if (j / CLAIMS_FILE).is_file():
            c = read_claims(j)
            c.insert(0, "job", j.name)
            claims.append(c)
    if claims:
        combined = pd.concat(claims, ignore_index=True)
        # runs from before claim ids are combined as they are (icl-exp report lists them as such)
        columns = [c for c in CLAIM_COLUMNS if c in combined.columns] if "id" in combined.columns \
            else [c for c in combined.columns if c != "job"]
        combined = combined[["job", *columns]]
        over_seeds = _over_seeds(sweep_dir, jobs, exp, combined)
        write_csv_atomic(sweep_dir / CLAIMS_FILE, combined if over_seeds is None else over_seeds)
    source = source_of([metrics_path(j) for j in jobs])
    with figure_caption(figure_title(exp, metrics, [_record(j) for j in jobs]), source=source):
        drawn = _plot(exp, metrics, sweep_dir / FIGURES_DIR, jobs)
        if claims and over_seeds is not None:
            drawn += plot_claims_over_seeds(combined, over_seeds, sweep_dir / FIGURES_DIR)
        return drawn


def _over_seeds(sweep_dir: Path, jobs: list[Path], exp: registry.Experiment, combined: pd.DataFrame):
    """A sweep whose jobs all completed and differ only by seed: its claims one row each (core/seeds.py);
    otherwise None, and the combined claims stay one row per job (a failed seed must not vanish from a tally)."""
    from experiments.core.summary import sweep_job_dirs

    if "id" not in combined.columns or len(sweep_job_dirs(sweep_dir)) != len(jobs):
        return None
    records = [_record(j) for j in jobs]
    if not seeds_only([list(r.get("overrides") or []) for r in records]):
        return None
    seeds = {j.name: r.get("seed") for j, r in zip(jobs, records, strict=True)}
    return aggregate_claims(combined, seeds, getattr(exp, "seed_quorum", 1.0))


def no_such_folder(path: Path, hint: str) -> UserError:
    """The one wording of a missing folder, for `icl-exp plot` and `icl-exp report` alike."""
    return UserError(f"{path}: no such folder ({hint})")


def is_sweep_dir(path: Path) -> bool:
    """Hydra's multirun folder: its multirun.yaml, or job folders named by job number (0, 1, ...)."""
    jobs = job_dirs(path)
    return (path / "multirun.yaml").is_file() or bool(jobs) and all(j.name.isdigit() for j in jobs)


def _started(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / RUN_FILE).read_text()).get("start") or "")
    except (OSError, ValueError):
        return ""


def _folder_of_runs(path: Path) -> UserError:
    """`icl-exp plot results/linreg_icl`: the folder an experiment's runs go in, not a run or a sweep.
    Say so, and point to the newest run (complete if there is one) or sweep."""
    runs = [p for p in job_dirs(path)]
    sweeps_dir = path / "multirun"
    sweeps = sorted(p for p in sweeps_dir.iterdir() if p.is_dir()) if sweeps_dir.is_dir() else []
    complete = [r for r in runs if run_state(r) == "complete"]
    newest = max(complete or runs, key=lambda r: (_started(r), r.name)) if runs else sweeps[-1]
    counts = [f"{len(runs)} run{'s' * (len(runs) != 1)}"] if runs else []
    if sweeps:
        counts.append(f"{len(sweeps)} sweep{'s' * (len(sweeps) != 1)} under {sweeps_dir}")
    which = "newest complete run" if complete else "newest run" if runs else "newest sweep"
    return UserError(f"{path} is a folder of runs ({', '.join(counts)}), not one run: plot one of them, "
                     f"e.g. the {which}: icl-exp plot {newest}")


def render(path: Path) -> list[Path]:
    """`icl-exp plot PATH`: a run folder or a multirun folder."""
    path = Path(path)
    if not path.exists():
        raise no_such_folder(path, "give a run folder, or a sweep's folder to combine its jobs")
    if is_run_dir(path):
        exp = registry.get(experiment_of(path))
        if not getattr(exp, "draws_figures", True):
            raise UserError(f"{exp.name} draws no figures ({exp.figures.strip('()')}): nothing to plot in {path}")
        if run_state(path) != "complete":
            return _render_incomplete_run(path)
        return _drawn(render_run(path), path)
    if job_dirs(path) and is_sweep_dir(path):
        return _drawn(render_multirun(path), path)
    if job_dirs(path) or (path / "multirun").is_dir() and any(p.is_dir() for p in (path / "multirun").iterdir()):
        raise _folder_of_runs(path)
    if (path / RUN_FILE).is_file():
        raise UserError(f"{path} is {run_state(path)} and wrote no {METRICS_FILE}: no figure to draw")
    if (path / "multirun.yaml").is_file():
        raise UserError(f"{path} is a sweep with no finished job: no figure to draw")
    raise UserError(f"{path} is not a run folder (no {RUN_FILE} + {METRICS_FILE}) nor a multirun folder")
