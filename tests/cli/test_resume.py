"""`icl-exp resume SWEEP_DIR`: a sweep whose job failed runs that job again, alone, in its own folder and with
the sweep's launcher, and its combined claims are those of a sweep that never stopped; a folder that is not
a sweep, a sweep of another experiment and a sweep run by other code are one line each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.sweeps import user_error_for_seed

# threads=1: the numbers of a job do not depend on the launcher's process (parallel vs in-process)
SMALL = ("preset=smoke", "seed=0,1", "train.steps=2", "eval.grid_tasks=1", "threads=1")


def _sweep(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("run", "linreg_icl", "-m", *SMALL, *args, f"hydra.sweep.dir={folder}", env=env)


def _claims(folder: Path) -> pd.DataFrame:
    """The sweep's combined claims (over seeds: one row per claim) and each job's own."""
    frames = [pd.read_csv(p).assign(file=str(p.relative_to(folder))) for p in sorted(folder.glob("*claims.csv"))]
    frames += [pd.read_csv(p).assign(file=str(p.relative_to(folder))) for p in sorted(folder.glob("*/claims.csv"))]
    return pd.concat(frames, ignore_index=True)


def _record(job: Path) -> dict:
    return json.loads((job / "run.json").read_text())


def test_a_failed_parallel_sweep_resumes_to_the_results_of_one_that_never_stopped(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    done = _sweep(whole)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = _sweep(broken, "hydra/launcher=parallel", env=user_error_for_seed(tmp_path, 0))
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert _record(broken / "0")["status"] == "failed"
    (broken / "0" / "traceback.txt").write_text("the last attempt's")
    kept = _record(broken / "1")

    resumed = run_cli("resume", str(broken))
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {broken}: job 0 of 2" in out
    assert "Joblib.Parallel" in out  # the sweep's own launcher
    assert _record(broken / "1") == kept  # the complete job did not run again
    assert _record(broken / "0")["status"] == "complete"
    assert not (broken / "0" / "traceback.txt").exists()
    assert (broken / "figures" / "fig2_linreg_icl.png").is_file()
    pd.testing.assert_frame_equal(_claims(broken), _claims(whole))

    again = run_cli("resume", str(broken))
    assert again.returncode == 0 and "nothing to resume" in again.stdout


def _fake_sweep(folder: Path, commit: str) -> Path:
    """A sweep folder of two jobs as Hydra leaves it: multirun.yaml and job 0, complete, run at `commit`."""
    (folder / "0" / ".hydra").mkdir(parents=True)
    (folder / "multirun.yaml").write_text(
        "hydra:\n  runtime:\n    choices:\n      experiment: cov_rate\n  sweeper:\n    params: null\n"
        "  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n    task: [experiment=cov_rate, preset=smoke, 'seed=0,1']\n")
    (folder / "0" / ".hydra" / "overrides.yaml").write_text("- experiment=cov_rate\n- preset=smoke\n- seed=0\n")
    (folder / "0" / "run.json").write_text(json.dumps({"experiment": "cov_rate", "status": "complete",
                                                       "git": {"commit": commit}}))
    return folder


@pytest.mark.parametrize("case, args, message", [
    ("not a sweep", ("resume", "{tmp}"), "is not a sweep's folder: no multirun.yaml"),
    ("a run, not a sweep", ("resume", "{tmp}/sweep/0"), "is a single run's folder: no multirun.yaml"),
    ("another experiment", ("run", "linreg_icl", "-m", "resume={tmp}/sweep"), "is a sweep of cov_rate, not linreg_icl"),
    ("other overrides", ("run", "cov_rate", "-m", "seed=3", "resume={tmp}/sweep"), "resume runs the sweep as it ran"),
    ("the code changed", ("resume", "{tmp}/sweep"), "job 0 ran at commit 0000000000ab, the code is now at"),
])
def test_bad_resumes_are_one_line_and_run_nothing(tmp_path, case, args, message):
    _fake_sweep(tmp_path / "sweep", "0000000000abcdef")
    proc = run_cli(*(a.format(tmp=tmp_path) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (case, proc.stderr[-2000:])
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["0", "multirun.yaml"]


def test_a_job_whose_overrides_are_not_the_sweeps_is_a_change(tmp_path):
    from experiments.core.resume import changes, read_sweep

    sweep = _fake_sweep(tmp_path / "sweep", "abc")
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- experiment=cov_rate\n- preset=smoke\n- seed=7\n")
    plan = read_sweep(sweep)
    assert plan.jobs == [["experiment=cov_rate", "preset=smoke", "seed=0"],
                         ["experiment=cov_rate", "preset=smoke", "seed=1"]]
    assert plan.incomplete() == [1]
    assert changes(plan, "abc") == ["job 0 ran with experiment=cov_rate preset=smoke seed=7, the sweep now gives "
                                    "it experiment=cov_rate preset=smoke seed=0"]


def test_consecutive_jobs_launch_together():
    from experiments.core.resume import runs_of

    assert runs_of([1, 2, 5, 7, 8]) == [[1, 2], [5], [7, 8]] and runs_of([]) == []


def test_allow_changed_resumes_and_says_each_change(tmp_path):
    sweep = _fake_sweep(tmp_path / "sweep", "0000000000abcdef")
    proc = run_cli("resume", str(sweep), "--allow-changed")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "warning: job 0 ran at commit 0000000000ab, the code is now at" in proc.stderr
    assert _record(sweep / "1")["status"] == "complete" and _record(sweep / "1")["seed"] == 1
    assert json.loads((sweep / "0" / "run.json").read_text())["git"]["commit"] == "0000000000abcdef"  # untouched
