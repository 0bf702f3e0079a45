"""A sweep over seeds only: one row per claim in its claims.csv (n_passed of n_seeds, the mean of `measured` and
its 95 % interval), a claim passing only on every seed, a figure of the claims over the seeds, and the same one
row in the report and the results page; any other sweep keeps one row per job."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from experiments.core.seeds import aggregate_claims, interval95, seeds_only
from tests.helpers.cli import run_cli


def _rows(measured: list[float], passed: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"job": [str(i) for i in range(len(measured))], "id": "p.fig1.x", "ref": "P Fig. 1",
                         "description": "x", "paper_value": float("nan"), "measured": measured, "tolerance": 2.5,
                         "comparison": "<=", "passed": passed, "measure": "x"})


def test_the_mean_and_its_95_interval_over_seeds():
    mean, lo, hi = interval95([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303
    assert mean == 2.0 and math.isclose(hi - mean, 4.303 / math.sqrt(3)) and math.isclose(mean - lo, hi - mean)
    assert interval95([5.0]) == (5.0, 5.0, 5.0)


def test_a_claim_passes_over_seeds_only_when_it_passes_on_every_seed_unless_a_quorum_says_otherwise():
    claims = _rows([1.0, 2.0, 3.0], [True, True, False])
    row = aggregate_claims(claims, {"0": 0, "1": 1, "2": 2}).iloc[0]
    assert not row.passed and (row.n_passed, row.n_seeds, row.seeds) == (2, 3, "0,1,2")
    assert row.measured == 2.0 and row.measured_lo < 2.0 < row.measured_hi
    assert aggregate_claims(claims, {}, quorum=2 / 3).iloc[0].passed
    assert aggregate_claims(_rows([1.0, 2.0], [True, True]), {}).iloc[0].passed
    nan = aggregate_claims(_rows([1.0, float("nan")], [True, False]), {}).iloc[0]
    assert not nan.passed and math.isnan(nan.measured)  # NaN fails, and is not averaged away


def test_only_jobs_that_differ_by_seed_alone_are_seeds():
    assert seeds_only([["preset=smoke", "seed=0"], ["preset=smoke", "seed=1"]])
    assert not seeds_only([["preset=smoke", "seed=0"], ["preset=cpu", "seed=1"]])  # a preset sweep
    assert not seeds_only([["dtype=float32"], ["dtype=float64"]])
    assert not seeds_only([["seed=0"]])


@pytest.fixture(scope="module")
def seed_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    sweep = root / "cov_rate" / "multirun" / "s"
    proc = run_cli("run", "cov_rate", "-m", "preset=smoke", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    assert (sweep / "claims.csv").is_file(), (proc.stdout + proc.stderr)[-3000:]
    return root, sweep


def test_a_seed_sweep_combines_its_claims_one_row_each(seed_sweep):
    _, sweep = seed_sweep
    combined = pd.read_csv(sweep / "claims.csv")
    jobs = pd.concat([pd.read_csv(sweep / str(k) / "claims.csv").assign(seed=k) for k in range(3)])
    assert sorted(combined.id) == sorted(jobs.id.unique()) and "job" not in combined.columns
    for row in combined.to_dict("records"):
        mine = jobs[jobs.id == row["id"]]
        assert row["n_seeds"] == 3 and row["seeds"] == "0,1,2"
        assert row["n_passed"] == int(mine.passed.sum()) and row["passed"] == bool(mine.passed.all())
        assert math.isclose(row["measured"], mine.measured.mean(), rel_tol=1e-12)
        assert row["measured_lo"] <= row["measured"] <= row["measured_hi"]
    assert (sweep / "figures" / "claims_over_seeds.png").is_file()
    assert (sweep / "figures" / "cov_rate.png").is_file()  # the experiment's own combined figure still


def test_the_report_and_results_page_show_one_row_per_claim_over_seeds(seed_sweep, tmp_path):
    root, sweep = seed_sweep
    page = tmp_path / "docs" / "results.md"
    proc = run_cli("report", str(root), "--out", str(tmp_path), "--results-md", str(page), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    combined = pd.read_csv(sweep / "claims.csv")
    for text in ((tmp_path / "report.md").read_text(), page.read_text()):
        for row in combined.to_dict("records"):
            lines = [ln for ln in text.splitlines() if ln.startswith("|") and f"`{row['id']}`" in ln]
            assert len(lines) == 1, lines
            assert "(95 %, 3 seeds)" in lines[0] and f"({row['n_passed']}/3 seeds)" in lines[0]


def test_a_seed_sweep_with_a_failed_job_keeps_one_row_per_job(seed_sweep, tmp_path):
    """A seed that failed must not vanish from the tally: no aggregation until every job completed."""
    import shutil

    from experiments.core.figures import render_multirun

    _, sweep = seed_sweep
    copy = tmp_path / "s"
    shutil.copytree(sweep, copy)
    record = json.loads((copy / "2" / "run.json").read_text())
    (copy / "2" / "run.json").write_text(json.dumps({**record, "status": "failed"}))
    render_multirun(copy, warn=False)
    assert pd.read_csv(copy / "claims.csv").job.astype(str).unique().tolist() == ["0", "1"]
