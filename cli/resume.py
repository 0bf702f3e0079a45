"""`icl-exp resume SWEEP_DIR` (or `icl-exp run NAME -m resume=SWEEP_DIR`): run again the jobs of a sweep
that did not complete, in their own folders, with the sweep's launcher; then the combined claims and
figures, as the sweep would have written them had it run once (experiments/core/resume.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

ALLOW_CHANGED = "--allow-changed"


def _config_changes(sweep) -> list[str]:
    """A job whose config, composed now from its overrides, is not the one it ran with (.hydra/config.yaml):
    conf/ or a schema changed since. Only jobs that wrote their config are compared."""
    from omegaconf import OmegaConf

    from cli.compose import compose_config

    out = []
    for num, job in enumerate(sweep.jobs):
        saved = sweep.job_dir(num) / ".hydra" / "config.yaml"
        if not saved.is_file():
            continue
        now = OmegaConf.to_container(compose_config(job), resolve=False)
        now.pop("hydra", None)
        then = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
        if now != then:
            keys = sorted(k for k in {*now, *then} if now.get(k) != then.get(k))
            out.append(f"job {num}'s config differs now in {', '.join(keys[:3])}{' ...' * (len(keys) > 3)} "
                       f"(conf/ or a schema changed since it ran)")
    return out


def check_resume(folder: Path, allow_changed: bool, experiment: str | None = None,
                 overrides: list[str] | None = None):
    """The sweep to resume and its jobs to run, every check made first: a UserError of one line for a
    folder that is not a sweep, a sweep of another experiment than `experiment`, other `overrides` than
    the sweep's, or jobs whose code or config changed (unless `allow_changed`)."""
    from cli.overrides import check_command_line
    from experiments.core import registry
    from experiments.core.errors import UserError
    from experiments.core.provenance import git_state
    from experiments.core.resume import changes, read_sweep

    sweep = read_sweep(folder)
    if experiment is not None and sweep.experiment != experiment:
        raise UserError(f"{sweep.folder} is a sweep of {sweep.experiment}, not {experiment}: "
                        f"icl-exp resume {sweep.folder}")
    own = [o for o in sweep.task_overrides if not o.startswith("experiment=")]
    if overrides and sorted(overrides) != sorted(own):
        raise UserError(f"resume runs the sweep as it ran ({' '.join(own) or 'no overrides'}); drop the other "
                        f"overrides: icl-exp resume {sweep.folder}")
    registry.check_name(sweep.experiment)
    check_command_line(sweep.experiment, [*own, *sweep.hydra_overrides], multirun=True)
    changed = changes(sweep, git_state().get("commit")) + _config_changes(sweep)
    if changed and not allow_changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UserError(f"{changed[0]}{more}: resuming would mix its results with the jobs run now; "
                        f"{ALLOW_CHANGED} resumes anyway")
    return sweep, sweep.incomplete(), changed


def resume_sweep(folder: Path, allow_changed: bool = False, experiment: str | None = None,
                 overrides: list[str] | None = None) -> Path:
    """Check, then hand the sweep's own command line to Hydra with the resuming sweeper."""
    from cli.output import err_console, fail
    from experiments.core.errors import UserError

    try:
        sweep, todo, changed = check_resume(folder, allow_changed, experiment, overrides)
    except UserError as err:
        fail(str(err))
    for line in changed:  # --allow-changed: said, not hidden
        err_console.print(f"warning: {line}", highlight=False, soft_wrap=True)
    if not todo:
        print(f"all {len(sweep.jobs)} jobs of {sweep.folder} are complete: nothing to resume")
        return sweep.folder
    print(f"resuming {sweep.folder}: job{'s' * (len(todo) > 1)} {', '.join(map(str, todo))} of {len(sweep.jobs)}",
          flush=True)
    sys.argv = ["icl-exp", *sweep.task_overrides, *sweep.hydra_overrides, f"hydra.sweep.dir={sweep.folder}",
                "hydra/sweeper=icl_exp_resume", "--multirun"]
    from cli import hydra_app  # after argv, which names the experiment

    hydra_app.main()
    return sweep.folder


def resume(
    sweep_dir: Path = typer.Argument(..., help="the sweep's folder (results/NAME/multirun/STAMP)"),
    allow_changed: bool = typer.Option(False, ALLOW_CHANGED, help="resume even where a job ran other code (git "
                                       "commit) or another config than the sweep gives it now"),
) -> None:
    """Run again the jobs of a sweep whose run.json is not complete (failed, interrupted, missing), in their
    own folders and with the sweep's launcher; then combine the claims and figures of all its jobs."""
    resume_sweep(sweep_dir, allow_changed)
