"""`logger=tensorboard|mlflow`: every row of metrics.csv and every claim mirrored into the tracker, read back
with the tracker's own offline reader (TensorBoard's event reader, MLflow's client on its file store); a
sweep's jobs grouped; an unreachable tracker is one warning and the run completes; a misspelt or
uninstalled logger is one line before any run."""

from __future__ import annotations

import importlib.util
import json
import os

import pandas as pd
import pytest

from experiments.core.trackers import TrackerCallback, series_name
from tests.helpers.cli import run_cli


def test_a_row_is_named_by_its_metric_and_index_but_its_step():
    row = {"experiment": "e", "run_id": "r", "metric": "hidden_rel", "value": 1.0, "step": 3, "layer": 2,
           "dtype": "float32", "token": float("nan")}
    assert series_name(row) == "hidden_rel/layer=2/dtype=float32"


def test_a_tracker_that_fails_is_dropped_with_one_warning_and_the_run_goes_on(caplog):
    class Broken:
        def metric(self, *args):
            raise ConnectionError("tracker down\nsecond line")

    callback = TrackerCallback(kind="mlflow")
    callback.tracker = Broken()
    callback.sink({"metric": "loss", "value": 1.0, "step": 0})
    callback.sink({"metric": "loss", "value": 2.0, "step": 1})  # dropped: no second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "could not log the tracker (ConnectionError: tracker down)" in warnings[0]
    assert callback.tracker is None


def _metric_rows(run_dir) -> pd.DataFrame:
    m = pd.read_csv(run_dir / "metrics.csv")
    m["name"] = [series_name(r) for r in m.to_dict("records")]
    return m


def test_tensorboard_holds_every_metric_row_and_claim(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    proc = run_cli("run", "cov_rate", "preset=smoke", "logger=tensorboard", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    m = _metric_rows(run_dir)
    for name, group in m.groupby("name"):
        assert scalars[name] == pytest.approx(group["value"].tolist(), rel=1e-6)  # float32 in the event file
    claims = pd.read_csv(run_dir / "claims.csv")
    for claim in claims.to_dict("records"):
        assert scalars[f"claim/{claim['id']}/passed"] == [float(claim["passed"])]
    assert len(scalars) == m["name"].nunique() + 2 * len(claims)


def test_mlflow_file_store_holds_a_sweeps_jobs_grouped_with_every_metric_and_claim(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    sweep, store = tmp_path / "sweep", f"file:{tmp_path / 'mlruns'}"
    proc = run_cli("run", "cov_rate", "-m", "preset=smoke", "seed=0,1", "logger=mlflow",
                   f"hydra.callbacks.logger.tracking_uri={store}", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("cov_rate").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["sweep-0", "sweep-1"]
    for run in runs:
        job = sweep / run.info.run_name.split("-")[-1]
        record = json.loads((job / "run.json").read_text())
        assert run.info.status == "FINISHED" and run.data.tags["sweep"] == "sweep"
        assert run.data.tags["status"] == "complete" and run.data.tags["seed"] == str(record["seed"])
        m = _metric_rows(job)
        name, group = next(iter(m.groupby("name")))
        history = client.get_metric_history(run.info.run_id, name.replace("=", "."))
        assert [h.value for h in history] == pytest.approx(group["value"].tolist(), rel=1e-12)
        claims = pd.read_csv(job / "claims.csv")
        assert {k: v for k, v in run.data.metrics.items() if k.startswith("claim/") and k.endswith("/passed")} == \
            {f"claim/{c['id']}/passed": float(c["passed"]) for c in claims.to_dict("records")}
        assert len(run.data.metrics) == m["name"].nunique() + 2 * len(claims)


def test_an_unreachable_tracker_is_one_warning_and_the_run_completes(tmp_path):
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    proc = run_cli("run", "cov_rate", "preset=smoke", "logger=mlflow",
                   "hydra.callbacks.logger.tracking_uri=http://127.0.0.1:9", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "logger=mlflow" in ln]
    assert len(warned) == 1 and "could not open the tracker" in warned[0] and "the run goes on" in warned[0]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    assert len(pd.read_csv(run_dir / "metrics.csv")) > 0


@pytest.mark.parametrize("value, message", [
    ("logger=mlfow", "logger=mlfow is not a logger: choose one of mlflow, none, tensorboard, wandb; did you mean "
                     "logger=mlflow?"),
    ("logger=wandb", "logger=wandb needs the wandb extra, which is not installed: pip install -e '.[wandb]'"),
])
def test_a_misspelt_or_uninstalled_logger_is_one_line(tmp_path, value, message):
    if value == "logger=wandb" and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    proc = run_cli("run", "cov_rate", "preset=smoke", value, f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "run").exists()
