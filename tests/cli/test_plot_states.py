"""`icl-exp plot` on a run or sweep that did not complete says so: an error (non-zero exit) where
nothing can be drawn, a warning line where it draws an incomplete run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.core import registry
from experiments.core.registry import Experiment
from tests.helpers.cli import assert_one_line_error


def _plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    if metrics.empty:
        return []
    figures_dir.mkdir(parents=True, exist_ok=True)
    out = figures_dir / "f.png"
    out.write_bytes(b"png")
    return [out]


@pytest.fixture
def fake_experiment(monkeypatch):
    exp = Experiment("nobody", "none", "for plot tests", run=lambda cfg, ctx: None, plot=_plot, name="fake")
    monkeypatch.setattr(registry, "get", lambda name: exp)


@pytest.fixture
def plot_cli():
    from typer.testing import CliRunner

    from cli.main import app

    class _Result:
        def __init__(self, r):
            self.returncode, self.stdout, self.stderr = r.exit_code, r.stdout, r.stderr

    return lambda path: _Result(CliRunner().invoke(app, ["plot", str(path)]))


def _run(folder: Path, status: str, rows: int, **extra) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"experiment": "fake", "status": status, **extra}))
    frame = pd.DataFrame({"experiment": ["fake"] * rows, "run_id": ["r"] * rows, "metric": ["m"] * rows,
                          "value": [1.0] * rows}, columns=["experiment", "run_id", "metric", "value"])
    frame.to_csv(folder / "metrics.csv", index=False)
    return folder


def test_failed_run_that_measured_nothing(fake_experiment, plot_cli, tmp_path):
    run = _run(tmp_path / "r", "failed", 0, error="RuntimeError: boom")
    proc = plot_cli(run)
    assert_one_line_error(proc, "is failed", "RuntimeError: boom", "no figure to draw")


def test_failed_run_without_metrics(fake_experiment, plot_cli, tmp_path):
    run = _run(tmp_path / "r", "failed", 0, error="RuntimeError: boom")
    (run / "metrics.csv").unlink()
    assert_one_line_error(plot_cli(run), "is failed", "wrote no metrics.csv")


def test_interrupted_run_is_drawn_with_a_warning(fake_experiment, plot_cli, tmp_path):
    run = _run(tmp_path / "r", "interrupted", 3, stopped_at="train 3/30", error="KeyboardInterrupt")
    proc = plot_cli(run)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "interrupted at train 3/30" in proc.stderr and "incomplete" in proc.stderr
    assert str(run / "figures" / "f.png") in proc.stdout


def test_empty_sweep(fake_experiment, plot_cli, tmp_path):
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    (tmp_path / "0" / ".hydra").mkdir(parents=True)  # a job that never wrote its run
    assert_one_line_error(plot_cli(tmp_path), "sweep with no finished job")


def test_sweep_whose_jobs_all_failed(fake_experiment, plot_cli, tmp_path):
    _run(tmp_path / "0", "failed", 2, error="RuntimeError: boom")
    _run(tmp_path / "1", "running", 2)
    proc = plot_cli(tmp_path)
    assert_one_line_error(proc, "no completed jobs")


def test_complete_run_that_draws_nothing(fake_experiment, plot_cli, tmp_path):
    run = _run(tmp_path / "r", "complete", 0)
    assert_one_line_error(plot_cli(run), "nothing to draw")
