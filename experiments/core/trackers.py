"""`logger=mlflow|tensorboard|wandb`: every `ctx.log` and the claims mirrored into the tracker a lab already
watches, offline (MLflow's file store, TensorBoard's event files, W&B's offline mode). metrics.csv stays the
record; a tracker is a copy, so a tracker that cannot be reached costs one warning and the run goes on.

conf/logger/<name>.yaml puts a `TrackerCallback` among Hydra's callbacks (package `hydra.callbacks.logger`,
so the experiment's config and its snapshots do not change). In each job's process it opens one tracker
run named after the run folder (a sweep's job: `<sweep>-<job>`, grouped by the sweep), forwards each row
`RunContext.log` writes (results.add_sink) as it is logged, and at the job's end the claims, run.json's
status and the run's tags. A row's name is its metric and its index but for `step`, which is the step
(`hidden_rel/layer=3/dtype=float32`); rows without a step are numbered in the order they came.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.core.errors import first_line

log = logging.getLogger(__name__)

# logger=NAME -> (the module it needs, the extra that installs it)
EXTRAS = {"mlflow": ("mlflow", "mlflow"), "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
_SKIP = {"experiment", "run_id", "metric", "value", "step"}


def series_name(row: dict[str, Any]) -> str:
    """`metric/key=value/...` for a tidy row's index (but its step), NaN-valued keys left out, whole floats
    written as integers."""
    parts = [str(row["metric"])]
    for key, value in row.items():
        if key in _SKIP or value is None or (isinstance(value, float) and value != value):
            continue
        if isinstance(value, float) and value.is_integer():  # `n=1`, also where a CSV column of ints read
            value = int(value)  # back as floats (NaN elsewhere in it) names it
        parts.append(f"{key}={value}")
    return "/".join(parts)


class _Tracker:
    """One tracker run: `metric(name, value, step)`, `tags(dict)`, `close(status)`."""

    def metric(self, name: str, value: float, step: int) -> None: ...

    def tags(self, tags: dict[str, str]) -> None: ...

    def close(self, status: str) -> None: ...


class _MLflow(_Tracker):
    def __init__(self, run_name: str, experiment: str, tags: dict, tracking_uri: str):
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:  # the file store works offline; MLflow
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # 3 asks for this opt-in to use it
        else:  # a server that does not answer: one try, not MLflow's minutes of retries, then the warning
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def metric(self, name, value, step):
        self.client.log_metric(self.run_id, _mlflow_key(name), value, step=step)

    def tags(self, tags):
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def close(self, status):
        self.client.set_terminated(self.run_id, "FINISHED" if status == "complete" else "FAILED")


def _mlflow_key(name: str) -> str:
    """MLflow's metric names take letters, digits and `_-. /` only."""
    return "".join(c if c.isalnum() or c in "_-. /" else "_" for c in name.replace("=", "."))


class _TensorBoard(_Tracker):
    def __init__(self, run_name: str, log_dir: Path, tags: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.writer.add_text("run", "  \n".join(f"{k}: {v}" for k, v in {"run": run_name, **tags}.items()))

    def metric(self, name, value, step):
        self.writer.add_scalar(name, value, global_step=step)

    def tags(self, tags):
        self.writer.add_text("tags", "  \n".join(f"{k}: {v}" for k, v in tags.items()))

    def close(self, status):
        self.writer.close()


class _WandB(_Tracker):
    def __init__(self, run_name: str, directory: Path, tags: dict, project: str, mode: str, group: str | None):
        import wandb

        self.run = wandb.init(project=project, name=run_name, dir=str(directory), mode=mode, group=group,
                              config=tags, reinit=True)

    def metric(self, name, value, step):
        self.run.log({name: value, "step": step})

    def tags(self, tags):
        self.run.summary.update(tags)

    def close(self, status):
        self.run.finish(exit_code=0 if status == "complete" else 1)


def _run_tags(run_dir: Path, sweep: str | None) -> dict[str, str]:
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        record = {}
    tags = {"run_dir": str(run_dir), **({"sweep": sweep} if sweep else {})}
    for key in ("experiment", "run_id", "status", "preset", "seed", "dtype", "device", "model", "claims_passed",
                "claims_total"):
        if record.get(key) is not None:
            tags[key] = str(record[key])
    if record.get("overrides"):
        tags["overrides"] = " ".join(record["overrides"])
    if (record.get("git") or {}).get("commit"):
        tags["git_commit"] = record["git"]["commit"]
    return tags


class TrackerCallback(Callback):
    """Hydra callback (conf/logger/*.yaml): a tracker run per job, fed by every ctx.log and, at the end, the
    claims and run.json's status. Any tracker error: one warning, the tracker is dropped, the run goes on."""

    def __init__(self, kind: str, tracking_uri: str | None = None, log_dir: str | None = None,
                 project: str = "icl-exp", mode: str = "offline") -> None:
        self.kind, self.tracking_uri, self.log_dir, self.project, self.mode = kind, tracking_uri, log_dir, project, mode
        self.tracker: _Tracker | None = None
        self.steps: dict[str, int] = {}
        self.run_dir: Path | None = None

    # -- Hydra's hooks ---------------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from experiments.core.distributed import is_main_process

        if not is_main_process():
            return
        hc = HydraConfig.get()
        self.run_dir = Path(hc.runtime.output_dir).absolute()
        sweep = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
        name = f"{sweep}-{self.run_dir.name}" if sweep else self.run_dir.name
        experiment = str(hc.runtime.choices.get("experiment"))
        tags = {"experiment": experiment, "run_dir": str(self.run_dir), **({"sweep": sweep} if sweep else {}),
                "overrides": " ".join(hc.overrides.task)}
        self.steps = {}
        self._guard("open", lambda: setattr(self, "tracker", self._open(name, experiment, tags, sweep)))
        if self.tracker is not None:
            from experiments.core.results import add_sink

            add_sink(self.sink)
            atexit.register(self._finish)  # a run that ends by SystemExit skips on_job_end

    def on_job_end(self, config: DictConfig, **kwargs) -> None:
        self._finish()

    # -- the mirror ------------------------------------------------------------------------------------
    def sink(self, row: dict[str, Any]) -> None:
        """One ctx.log row, as it is logged."""
        if self.tracker is None:
            return
        name = series_name(row)
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = self.steps.get(name, 0)
            self.steps[name] = step + 1
        self._guard("log", lambda: self.tracker.metric(name, float(row["value"]), step))

    def _finish(self) -> None:
        from experiments.core.results import remove_sink

        remove_sink(self.sink)
        tracker, self.tracker = self.tracker, None
        if tracker is None or self.run_dir is None:
            return
        self.tracker = tracker
        tags = _run_tags(self.run_dir, None)
        self._guard("close", lambda: self._claims_and_close(tracker, tags))
        self.tracker = None

    def _claims_and_close(self, tracker: _Tracker, tags: dict) -> None:
        import pandas as pd

        claims_file = self.run_dir / "claims.csv"
        if claims_file.is_file():
            for claim in pd.read_csv(claims_file).to_dict("records"):
                tracker.metric(f"claim/{claim['id']}/measured", float(claim["measured"]), 0)
                tracker.metric(f"claim/{claim['id']}/passed", float(str(claim["passed"]) == "True"), 0)
        tracker.tags(tags)
        tracker.close(tags.get("status", "unknown"))

    def _open(self, name: str, experiment: str, tags: dict, sweep: str | None) -> _Tracker:
        if self.kind == "mlflow":
            return _MLflow(name, experiment, tags, self.tracking_uri or "file:./mlruns")
        if self.kind == "tensorboard":
            return _TensorBoard(name, Path(self.log_dir) if self.log_dir else self.run_dir / "tensorboard", tags)
        if self.kind == "wandb":
            return _WandB(name, self.run_dir, tags, self.project, self.mode, sweep)
        raise ValueError(f"unknown tracker {self.kind!r}")

    def _guard(self, what: str, step) -> None:
        """A tracker's failure: one warning line, the tracker dropped, the run goes on (metrics.csv is intact)."""
        try:
            step()
        except Exception as err:  # any tracker failure (network, disk, its own bugs)
            log.warning("logger=%s: could not %s the tracker (%s); the run goes on without it, metrics.csv "
                        "is complete", self.kind, what, first_line(err, typed=True))
            self.tracker = None
