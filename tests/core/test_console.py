"""What a run prints: compact numbers, claims read per comparison, a summary with the files, a
note on smoke runs, paths never wrapped, progress quiet when piped, Ctrl-C as one line and
`interrupted` in run.json."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments.core import progress as progress_module
from experiments.core.progress import last_progress, progress
from experiments.core.summary import claim_line, fmt
from tests.conftest import REPO_ROOT


def test_numbers_are_compact():
    assert fmt(0.00011920928955078125) == "0.000119"
    assert fmt(87.5) == "87.5" and fmt(float("nan")) == "nan" and fmt("n/a") == "n/a"


@pytest.mark.parametrize(
    "row, expected",
    [
        (dict(id="a.b", measured=3.2e-7, comparison="<=", tolerance=0.00011920928955078125, passed=True),
         "claim PASS a.b: measured 3.2e-07 <= 0.000119 (bound)"),
        (dict(id="a.b", measured=98.5, comparison=">=", tolerance=87.5, passed=True),
         "claim PASS a.b: measured 98.5 >= 87.5 (bar to clear)"),
        (dict(id="a.b", measured=0.47, comparison="within", tolerance=0.05, paper_value=0.4875, passed=True),
         "claim PASS a.b: measured 0.47 within 0.05 of the paper's 0.487"),
        # digits enough to see the tolerance: Table 2's 84.95M must not read "85 within 0.005 of 85"
        (dict(id="a.b", measured=84.9503, comparison="within", tolerance=0.005, paper_value=84.95, passed=True),
         "claim PASS a.b: measured 84.9503 within 0.005 of the paper's 84.95"),
        (dict(claim="old", measured=2.0, tolerance=0.00011920928955078125, passed=False),
         "claim FAIL old: measured 2 (tolerance 0.000119)"),
        # with a `measure` label the line says what the number is
        (dict(id="a.b", measured=7.0, comparison=">=", tolerance=1.0, passed=True,
              measure="log10(control L∞ / patched L∞)"),
         "claim PASS a.b: log10(control L∞ / patched L∞) = 7 >= 1 (bar to clear)"),
        (dict(id="a.b", measured=0.5, comparison="<=", tolerance=1.0, passed=True, measure=float("nan")),
         "claim PASS a.b: measured 0.5 <= 1 (bound)"),  # an empty label read back from claims.csv
    ],
)
def test_claim_lines_read_the_tolerance_per_comparison(row, expected):
    assert claim_line(row) == expected


def test_smoke_run_prints_a_summary_and_unwrapped_paths(icl, tmp_path):
    run_dir = tmp_path / ("a_rather_long_folder_name_" * 4) / "run"  # longer than 80 columns
    proc = icl("run", "linreg_icl", "preset=smoke", "train.steps=2", "eval.grid_tasks=1", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    summary = next(ln for ln in lines if ln.startswith("claims: "))
    assert "passed" in summary and "failed" in summary and str(run_dir / "claims.csv") in summary
    assert any(ln == f"metrics: {run_dir / 'metrics.csv'}" for ln in lines)
    assert any(ln.startswith("done in ") and ln.endswith(str(run_dir)) for ln in lines)
    assert any(ln.startswith("note: preset=smoke") for ln in lines)  # its learning claim fails, as expected
    assert not any(ln.startswith("[20") for ln in lines)  # no timestamp prefix on the console
    assert "0.00011920928955078125" not in proc.stdout


def test_progress_is_quiet_when_piped(caplog):
    with caplog.at_level(logging.INFO, logger="icl_exp.progress"):
        with progress(1000, "train") as bar:
            for _ in range(1000):
                bar.advance(1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("train: 1000/1000 in ")


def test_progress_lines_carry_an_eta(caplog, monkeypatch):
    monkeypatch.setattr(progress_module, "PLAIN_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="icl_exp.progress"):
        with progress(4, "train") as bar:
            bar.advance(1)
            time.sleep(0.01)
            bar.advance(1)
    assert "left" in caplog.records[0].getMessage()


def test_an_exception_leaves_the_loop_position():
    progress_module.reset()
    with pytest.raises(RuntimeError):
        with progress(10, "outer") as outer:
            outer.advance(3)
            with progress(5, "inner") as inner:
                inner.advance(2)
                raise RuntimeError
    assert last_progress() == "inner 2/5"


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_ctrl_c_is_one_line_and_interrupted(tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "linreg_icl", "preset=cpu",
                             f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    deadline = time.time() + 240
    while time.time() < deadline and not (run_dir / "metrics.csv").exists():  # first flush: training runs
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), err
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and record["end"] is not None
    assert record["stopped_at"] and record["stopped_at"].split()[0] in err
