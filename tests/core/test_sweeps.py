"""A sweep survives a failing job: every job runs, each run.json ends complete / failed /
interrupted (never running), the sweep prints one line per failed job, combines the completed
jobs' figures and claims, and exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from experiments.core.figures import render_multirun
from tests.helpers.cli import run_cli
from tests.helpers.repo import REPO_ROOT
from tests.helpers.sweeps import user_error_for_seed

FIGURE = "fig2_linreg_icl"
SMALL = ("preset=smoke", "seed=0,1", "train.steps=2", "eval.grid_tasks=1")


def _sweep(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("run", "linreg_icl", "-m", *args, *SMALL, f"hydra.sweep.dir={tmp_path / 'sweep'}", env=env)


def _break_metrics_file(tmp_path: Path, job: str) -> None:
    """A folder where the job's metrics.csv should go: that job fails at run time (IsADirectoryError),
    as a run does on a full or broken disk; its siblings are untouched."""
    (tmp_path / "sweep" / job / "metrics.csv").mkdir(parents=True)


def _status(tmp_path: Path, job: str) -> dict:
    return json.loads((tmp_path / "sweep" / job / "run.json").read_text())


def _assert_survived(proc, tmp_path: Path, failed_job: str, reason: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    healthy = "1" if failed_job == "0" else "0"
    assert _status(tmp_path, healthy)["status"] == "complete"
    failed = _status(tmp_path, failed_job)
    assert failed["status"] == "failed" and reason in failed["error"]
    # the summary: one line per failed job, naming it and why
    line = next(ln for ln in out.splitlines() if f"job {failed_job} (" in ln)
    assert reason in line and f"seed={failed_job}" in line
    assert "1 of 2 jobs failed" in out
    sweep = tmp_path / "sweep"
    assert (sweep / "figures" / f"{FIGURE}.png").is_file()
    assert pd.read_csv(sweep / "claims.csv").job.astype(str).unique().tolist() == [healthy]


def test_basic_launcher_runs_the_jobs_after_a_failing_one(tmp_path):
    _break_metrics_file(tmp_path, "0")
    proc = _sweep(tmp_path)
    _assert_survived(proc, tmp_path, "0", "IsADirectoryError")


def test_basic_launcher_goes_on_after_a_user_error_at_run_time(tmp_path):
    proc = _sweep(tmp_path, env=user_error_for_seed(tmp_path, 0))
    _assert_survived(proc, tmp_path, "0", "deliberate failure for seed 0")


def test_parallel_launcher_keeps_the_healthy_sibling(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    """`hydra/launcher=parallel` (conf/hydra/launcher/parallel.yaml): the two jobs in two processes."""
    proc = _sweep(tmp_path, "hydra/launcher=parallel", env=user_error_for_seed(tmp_path, 1))
    _assert_survived(proc, tmp_path, "1", "deliberate failure for seed 1")
    assert "Joblib.Parallel(n_jobs=2" in proc.stderr + proc.stdout


def test_every_job_is_checked_once_by_the_cli_before_the_first_job_starts(tmp_path):
    """One route: the CLI composes and checks each job's config (the experiment's validate() included), all
    of them before any job runs, and a job does not check its config again."""
    log = tmp_path / "events.txt"
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import dataclasses

        import experiments.core.registry as registry

        _get = registry.get

        def get(name):
            exp = _get(name)

            def note(what, cfg):
                with open({str(log)!r}, "a") as f:
                    f.write(f"{{what}} seed={{cfg.seed}}\\n")

            def validate(cfg):
                note("check", cfg)
                exp.validate(cfg)

            def run(cfg, ctx):
                note("run", cfg)
                exp.run(cfg, ctx)

            return dataclasses.replace(exp, validate=validate, run=run)

        registry.get = get
    """))
    proc = _sweep(tmp_path, env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), str(REPO_ROOT)])})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert log.read_text().splitlines() == ["check seed=0", "check seed=1", "run seed=0", "run seed=1"]


def test_combining_a_sweep_uses_only_its_completed_jobs(tmp_path, caplog):
    """A failed job keeps its partial metrics.csv; combining skips it and says so."""
    for job, status in (("0", "complete"), ("1", "failed")):
        d = tmp_path / job
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"experiment": "cov_rate", "status": status, "error": "boom"}))
        pd.DataFrame({"experiment": ["cov_rate"], "run_id": [job], "metric": ["x"], "value": [1.0]}).to_csv(
            d / "metrics.csv", index=False)
    seen = []
    import experiments.core.registry as registry

    class _Exp:
        def plot(self, metrics, figures_dir):
            seen.append(sorted(metrics.run_id.astype(str).unique()))
            return []

    orig = registry.get
    registry.get = lambda name: _Exp()
    try:
        with caplog.at_level("WARNING"):
            render_multirun(tmp_path)
    finally:
        registry.get = orig
    assert seen == [["0"]]
    assert "job 1" in caplog.text and "failed" in caplog.text


def test_under_torchrun_only_rank0_combines_and_reports_the_sweep(tmp_path, monkeypatch, capsys):
    """Every torchrun rank runs the whole sweep and its end callback: ranks > 0 must not draw, write
    claims or print the summary (rank 0 does; its exit status carries the failed job)."""
    from omegaconf import OmegaConf

    import experiments.core.registry as registry
    from experiments.core.callbacks import CombineMultirun

    for job, status in (("0", "complete"), ("1", "failed")):
        (tmp_path / job).mkdir()
        (tmp_path / job / "run.json").write_text(json.dumps({"experiment": "cov_rate", "status": status,
                                                             "error": "boom", "overrides": [f"seed={job}"]}))
        pd.DataFrame({"experiment": ["cov_rate"], "run_id": [job], "metric": ["x"], "value": [1.0]}).to_csv(
            tmp_path / job / "metrics.csv", index=False)
    drawn = []

    class _Exp:
        def plot(self, metrics, figures_dir):
            drawn.append(os.environ.get("RANK"))
            return []

    monkeypatch.setattr(registry, "get", lambda name: _Exp())
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    CombineMultirun().on_multirun_end(config)  # returns: no summary, no exit status of its own
    assert drawn == [] and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_:
        CombineMultirun().on_multirun_end(config)
    assert exit_.value.code == 1 and drawn == ["0"] and "job 1" in capsys.readouterr().err
