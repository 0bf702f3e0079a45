"""What a run prints: compact numbers, claims read per comparison, a summary with the files, a
note on smoke runs, paths never wrapped, progress quiet when piped (Ctrl-C: test_interrupts.py)."""

from __future__ import annotations

import logging
import time

import pytest

from experiments.core import progress as progress_module
from experiments.core.progress import last_progress, progress
from experiments.core.summary import claim_line, fmt


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
