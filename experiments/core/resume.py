"""Resume a sweep: what its multirun.yaml asked for, which of its jobs did not complete, and what changed.

Hydra itself has no sweep resume. A sweep's folder keeps what it needs: multirun.yaml holds the command
line's task overrides (`seed=0,1,2`) and Hydra's own (the launcher, the sweep folder); Hydra's sweeper
expands them into jobs in a fixed order, job k in the folder `k`, and each job's run.json says whether
it completed. Resuming expands the same overrides the same way and runs again only the jobs whose
run.json is not `complete` (failed, interrupted, running when its process died, or missing), in their
own folders, with the same launcher (hydra_plugins/icl_exp_resume: the sweeper that skips the rest).

A job that ran other code (its run.json's git commit) or whose overrides are not those the sweep gives
it now would be mixed silently into the combined claims: `changes` lists them, and the CLI refuses
unless told --allow-changed. Whether the composed config changed (conf/ or a schema edited since) is
the CLI's check (cli/resume.py), which composes configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from experiments.core.errors import UserError, first_line
from experiments.core.run_folder import RUN_FILE

SWEEP_FILE = "multirun.yaml"
# the sweep's own Hydra overrides that a resume sets itself
_RESET = ("hydra.sweep.dir=", "hydra.mode=", "hydra/sweeper=")


@dataclass
class Sweep:
    """A sweep folder as multirun.yaml and its jobs' folders describe it."""

    folder: Path
    experiment: str
    task_overrides: list[str]  # as typed, `experiment=NAME` first: `seed=0,1,2` (a sweep) stays as it is
    hydra_overrides: list[str]  # the launcher and the like, without those a resume sets itself
    jobs: list[list[str]]  # each job's task overrides, job k = jobs[k]

    def job_dir(self, num: int) -> Path:
        return self.folder / str(num)

    def state(self, num: int) -> str:
        return job_state(self.job_dir(num))

    def incomplete(self) -> list[int]:
        return [k for k in range(len(self.jobs)) if self.state(k) != "complete"]


def job_state(job_dir: Path) -> str:
    """`complete`, `failed`, `interrupted`, `running` (its process died, or it runs now) or `missing`."""
    try:
        return str(json.loads((job_dir / RUN_FILE).read_text()).get("status") or "missing")
    except (OSError, ValueError):
        return "missing"


def expand(task_overrides: list[str], params: dict | None = None) -> list[list[str]]:
    """Each job's overrides, in the order Hydra's basic sweeper numbers them (its own expansion)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = [f"{k}={v}" for k, v in (params or {}).items()] + list(task_overrides)
    parsed = OverridesParser.create().parse_overrides(given)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def read_sweep(folder: Path) -> Sweep:
    """The sweep in `folder`; a UserError of one line when it is not one."""
    folder = Path(folder).absolute()
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (give the folder of a sweep, `icl-exp run NAME -m ...`)")
    if not (folder / SWEEP_FILE).is_file():
        what = "a single run's folder" if (folder / RUN_FILE).is_file() else "not a sweep's folder"
        raise UserError(f"{folder} is {what}: no {SWEEP_FILE} (resume takes the folder `icl-exp run NAME -m ...` "
                        f"made, e.g. results/NAME/multirun/STAMP)")
    try:
        cfg = OmegaConf.load(folder / SWEEP_FILE)
        hydra = cfg.hydra
        experiment = str(hydra.runtime.choices.experiment)
        task = [str(o) for o in hydra.overrides.task]
        own = [str(o) for o in hydra.overrides.hydra if not str(o).startswith(_RESET)]
        params = OmegaConf.to_container(hydra.sweeper.params) if hydra.sweeper.get("params") else None
    except Exception as err:  # a hand-edited or truncated file
        raise UserError(f"{folder / SWEEP_FILE} is not a sweep's Hydra config ({first_line(err, typed=True)})") \
            from None
    return Sweep(folder, experiment, task, own, expand(task, params))


def _job_record(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _job_overrides(job_dir: Path) -> list[str] | None:
    path = job_dir / ".hydra" / "overrides.yaml"
    try:
        return [str(o) for o in OmegaConf.load(path)] if path.is_file() else None
    except Exception:
        return None


def changes(sweep: Sweep, commit: str | None) -> list[str]:
    """One line per job that ran other code than `commit` (the code now) or other overrides than the sweep
    gives it now: resuming would mix them with the jobs run next."""
    out = []
    for num, expected in enumerate(sweep.jobs):
        job = sweep.job_dir(num)
        ran = (_job_record(job).get("git") or {}).get("commit")
        if ran and commit and ran != commit:
            out.append(f"job {num} ran at commit {ran[:12]}, the code is now at {commit[:12]}")
        given = _job_overrides(job)
        if given is not None and sorted(given) != sorted(expected):
            out.append(f"job {num} ran with {' '.join(given)}, the sweep now gives it {' '.join(expected)}")
    return out


def runs_of(nums: list[int]) -> list[list[int]]:
    """Consecutive job numbers grouped: [1, 2, 5] -> [[1, 2], [5]]. A launcher numbers a batch's jobs from
    its first, so each group is one launch and every job keeps its number, its folder and its run id."""
    groups: list[list[int]] = []
    for k in nums:
        if groups and groups[-1][-1] == k - 1:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def _basic_sweeper():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


class ResumeSweeper(_basic_sweeper()):
    """Hydra's basic sweeper, launching only the jobs of the sweep folder that did not complete, through
    the configured launcher; multirun.yaml stays the one the sweep wrote (`hydra/sweeper=icl_exp_resume`,
    set by `icl-exp resume`)."""

    def __init__(self, max_batch_size: int | None = None, params: dict | None = None) -> None:
        # BasicSweeper.__init__ calls super(BasicSweeper, self): Hydra's plugin scan re-executes its module,
        # so that name can be another class object than the base here. Its attributes, set directly:
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context = self.config = self.launcher = None

    def sweep(self, arguments: list[str]) -> list:
        import logging

        from hydra.core.override_parser.overrides_parser import OverridesParser

        log = logging.getLogger(__name__)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = [job for batch in self.split_arguments(parsed, None) for job in batch]
        sweep_dir = Path(self.config.hydra.sweep.dir)
        todo = [k for k in range(len(jobs)) if job_state(sweep_dir / str(k)) != "complete"]
        log.info("resuming %s: %d of %d jobs to run (%s)", sweep_dir, len(todo), len(jobs),
                 ", ".join(str(k) for k in todo) or "none")
        returns = []
        for group in runs_of(todo):
            batch = [jobs[k] for k in group]
            for k in group:  # the last attempt's traceback would outlive the job that now runs again
                (sweep_dir / str(k) / "traceback.txt").unlink(missing_ok=True)
            self.validate_batch_is_legal(batch)
            returns.append(self.launcher.launch(batch, initial_job_idx=group[0]))
        return returns


def register_config() -> None:
    """`hydra/sweeper=icl_exp_resume`: the basic sweeper's node with the resuming class."""
    from dataclasses import make_dataclass

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeperConf
    from hydra.core.config_store import ConfigStore

    node = make_dataclass("ResumeSweeperConf", [("_target_", str, "hydra_plugins.icl_exp_resume.ResumeSweeper")],
                          bases=(BasicSweeperConf,))
    ConfigStore.instance().store(group="hydra/sweeper", name="icl_exp_resume", node=node, provider="icl_exp")
