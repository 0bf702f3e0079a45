"""Hydra's own entry point. The CLI hands it argv untouched (plus `experiment=NAME` and the output
folder), so multirun, launchers, `hydra.run.dir=...`, `--cfg job` and logging behave exactly as
Hydra users expect."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import hydra
from hydra._internal.hydra import Hydra
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments.core.config_store import register_schemas
from experiments.core.errors import UserError
from experiments.core.registry import CONF_DIR

# Before @hydra.main composes: conf/config.yaml selects `experiment: NAME` from the ConfigStore. The CLI imports
# this module once argv names the experiment (storing one config, not twenty: 0.6 s of a one-line answer); a
# launcher's worker process (joblib, SLURM) imports it to unpickle the job, with argv of its own: every one.
register_schemas(*(arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("experiment=")))


def _mode_said_on_the_command_line(get_mode):
    """Hydra 1.3 composes a whole config to read `hydra.mode`, then composes it again to run (hydra#3440, open;
    the fix proposed there reads the mode from the overrides first): the CLI says the mode (`hydra.mode=RUN` or
    `MULTIRUN`), so it is read from there and a job is composed once. Without it, Hydra's own answer."""

    def read(self, config_name, overrides):
        said = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.mode=")]
        return RunMode[said[-1]] if said and said[-1] in RunMode.__members__ else get_mode(self, config_name,
                                                                                           overrides)
    return read


Hydra.get_mode = _mode_said_on_the_command_line(Hydra.get_mode)

# A plain run's checks run in its job, once Hydra has composed its config (cli/launch.py asks for them with
# `checked_in_job`; a sweep's jobs were all checked by the CLI before the first began, and do not check again).
_state = {"check": False, "began": False}  # began: the job passed its checks (run.json written from then on)


@contextmanager
def checked_in_job():
    """While the CLI runs a plain run through main(): its job checks its config before it begins."""
    _state.update(check=True)
    try:
        yield
    finally:
        _state.update(check=False)


def job_began() -> bool:
    """Whether the job this process last handed to Hydra passed its checks and began (since `forget_job`)."""
    return _state["began"]


def forget_job() -> None:
    """Before the CLI hands Hydra a command line: no job of it has begun (a test runs many in one process)."""
    _state["began"] = False


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict:
    """One job. In a sweep a job that fails returns its failure instead of raising: Hydra's sweeper
    and joblib then go on with its siblings (an exception, SystemExit above all, would stop the
    basic launcher or make joblib kill the other workers), and the sweep's end
    (experiments.core.callbacks) reports it and sets the exit code."""
    from hydra.core.hydra_config import HydraConfig

    sweeping = HydraConfig.get().mode == RunMode.MULTIRUN
    _state["began"] = False
    try:
        if _state["check"] and not sweeping:
            from cli.check_job import check_in_job
            from experiments.zoo.kept_checks import checks_kept

            with checks_kept():  # the job's model check, made once here, is its load's (zoo/kept_checks.py)
                check_in_job(HydraConfig.get().runtime.choices["experiment"], cfg)
                _run(cfg)
        else:
            _run(cfg)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: run.json already says interrupted; one line
        if not job_began():  # during the checks: the CLI's line for a run that had not begun, no folder kept
            raise
        from experiments.core.progress import last_progress

        where = f" at {last_progress()}" if last_progress() else ""
        print(f"interrupted{where} ({str(err) or 'Ctrl-C'}): what it measured is kept in "
              f"{HydraConfig.get().runtime.output_dir} (run.json: interrupted)", file=sys.stderr)
        raise SystemExit(130) from None
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        if sweeping:
            return {"status": "failed", "error": str(err)}
        raise SystemExit(2) from None
    except Exception as err:
        if not sweeping:
            raise  # a bug: Hydra prints the traceback
        # The sweep's summary gives one line per job; the traceback goes next to the job's run.json.
        import traceback
        from pathlib import Path

        from experiments.core.atomic import write_text_atomic

        where = Path(HydraConfig.get().runtime.output_dir) / "traceback.txt"
        write_text_atomic(where, "".join(traceback.format_exception(err)))
        print(f"error: {type(err).__name__}: {err} (traceback: {where})", file=sys.stderr)
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    return {"status": "complete"}


def _run(cfg: DictConfig) -> None:
    """The job, once checked: the runner (torch, matplotlib) imported only now, so a refusal does not wait on it."""
    from experiments.core.runner import run_from_hydra

    _state["began"] = True
    run_from_hydra(cfg)
