"""`icl-exp reproduce`: dependency order, one linreg_icl checkpoint shared, a failure that stops nothing, the report."""

from __future__ import annotations

import json

import pandas as pd

from cli.reproduce import ordered, split_overrides
from tests.helpers.cli import run_cli


def test_order_and_overrides():
    assert ordered(["cov_rate", "factorization", "linreg_icl", "dw_convergence"]) == [
        "linreg_icl", "dw_convergence", "factorization", "cov_rate"]
    preset, common, per = split_overrides(["preset=smoke", "seed=1", "linreg_icl:train.steps=5"],
                                          ["linreg_icl", "cov_rate"])
    assert preset == "smoke" and common == ["seed=1"] and per == {"linreg_icl": ["train.steps=5"], "cov_rate": []}
    assert split_overrides([], ["x"])[0] == "cpu"  # the default preset


def test_reproduce_a_subset_at_smoke(tmp_path):
    """linreg_icl runs first and its folder is factorization's checkpoint; dw_convergence, given a bad
    value, fails in one line without stopping the others; the report is written; the exit status says so."""
    root = tmp_path / "rep"
    proc = run_cli("reproduce", "preset=smoke", "--only", "factorization,dw_convergence,linreg_icl",
                   "dw_convergence:dynamics.n_tasks=0", "linreg_icl:eval.grid_tasks=1", "--results", str(root))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    order = [line.split()[1] for line in lines if line.startswith(("ok", "FAILED"))]
    assert order == ["linreg_icl", "dw_convergence", "factorization"]
    assert any(line.startswith("FAILED dw_convergence") and "dynamics.n_tasks=0 must be at least 1" in line
               for line in lines)
    assert "failed: dw_convergence" in proc.stdout
    for name in ("linreg_icl", "factorization"):
        assert json.loads((root / name / "run.json").read_text())["status"] == "complete"
    record = json.loads((root / "factorization" / "run.json").read_text())
    assert f"checkpoint={(root / 'linreg_icl').resolve()}" in record["overrides"]
    assert not (root / "factorization" / "model.pt").exists()  # loaded linreg_icl's, trained nothing
    assert (root / "logs" / "dw_convergence.log").is_file()
    report = (root / "report.md").read_text()
    assert "missing**: dw_convergence" in report and "### factorization" in report and "### linreg_icl" in report
    claims = pd.read_csv(root / "factorization" / "claims.csv")
    assert claims["id"].notna().all() and claims["id"].str.startswith("dherin.").all()
    assert (root / "report.html").stat().st_size > 10_000  # figures embedded


def test_reproduce_sweeps_what_an_experiment_asks_and_the_report_names_the_model(tmp_path):
    """gemma_match's reproduce sweep: the paper's Algorithm 1 and the conditioned open loop, two jobs in one
    folder; the report shows both variants' claims, each with the model it was measured on and its weights."""
    root = tmp_path / "rep"
    proc = run_cli("reproduce", "preset=smoke", "--only", "gemma_match", "gemma_match:prompts=[]",
                   "gemma_match:max_new_tokens=2", "--results", str(root))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    overrides = [json.loads((root / "gemma_match" / job / "run.json").read_text())["overrides"] for job in "01"]
    assert [o for job in overrides for o in job if o.startswith("variant=")] == ["variant=naive", "variant=conditioned"]
    report = (root / "report.md").read_text()
    assert "goldwaser.fig3.naive_float32_top1_match" in report
    assert "goldwaser.fig3.conditioned_float32_top1_match" in report
    assert "tiny-gemma3 (random)" in report
