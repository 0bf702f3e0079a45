"""Hydra's own entry point. The CLI hands it argv untouched (plus `experiment=NAME` and the output
folder), so multirun, launchers, `hydra.run.dir=...`, `--cfg job` and logging behave exactly as
Hydra users expect."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from experiments.core.config_store import register_schemas
from experiments.core.errors import UserError
from experiments.core.registry import CONF_DIR

register_schemas()  # before @hydra.main composes: conf/config.yaml selects `experiment: NAME` from the ConfigStore


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> dict:
    """One job. In a sweep a job that fails returns its failure instead of raising: Hydra's sweeper
    and joblib then go on with its siblings (an exception, SystemExit above all, would stop the
    basic launcher or make joblib kill the other workers), and the sweep's end
    (experiments.core.callbacks) reports it and sets the exit code."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from experiments.core.runner import run_from_hydra

    sweeping = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        run_from_hydra(cfg)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: run.json already says interrupted; one line
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
