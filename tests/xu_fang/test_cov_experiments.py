"""The four Xu & Fang experiments end to end through the real CLI at preset=smoke, asserting on
what they write. Each experiment runs once per session (tests/helpers/smoke_runs.py), and several tests read its
folder; what every run folder must hold is checked by tests/core/test_run_folder_contract.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers.cli import run_cli

EXPERIMENTS = ("cov_alignment", "cov_icl_gd", "cov_rate", "markov_collapse")


@pytest.fixture(scope="module")
def runs(smoke_runs) -> dict[str, Path]:
    """The session's shared smoke runs of the four (tests/helpers/smoke_runs.py)."""
    return {name: smoke_runs(name) for name in EXPERIMENTS}


def load(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    return (pd.read_csv(run_dir / "metrics.csv"), pd.read_csv(run_dir / "claims.csv"),
            json.loads((run_dir / "run.json").read_text()))


def values(metrics: pd.DataFrame, name: str, **where) -> pd.DataFrame:
    frame = metrics[metrics["metric"] == name]
    for key, value in where.items():
        frame = frame[frame[key] == value]
    assert not frame.empty, f"no rows for {name} {where}"
    return frame


def test_cov_alignment_cosine_rises_and_beats_its_controls(runs):
    metrics, claims, _ = load(runs["cov_alignment"])
    assert sorted(values(metrics, "cos_readout")["d"].unique()) == [8, 16]
    for d in (8, 16):
        cos = values(metrics, "cos_readout", d=d).groupby("token_index")["value"].mean()
        blind = values(metrics, "cos_blind", d=d).groupby("token_index")["value"].mean()
        unrelated = values(metrics, "cos_unrelated", d=d).groupby("token_index")["value"].mean()
        assert cos.iloc[-4:].mean() > 0.9 > cos.iloc[:3].mean() + 0.3
        assert cos.iloc[-4:].mean() > blind.iloc[-4:].mean() + 0.1
        assert abs(unrelated.iloc[-8:].mean()) < 0.3
        gamma = values(metrics, "gamma_ratio", d=d).groupby("token_index")["value"].mean()
        assert gamma.iloc[-4:].mean() == pytest.approx(1.0, abs=0.1)  # γ_Σ = 1/√d_k
    assert sorted(claims["id"]) == sorted(f"xu_fang.{k}_d{d}" for d in (8, 16) for k in (
        "thm3_4.alignment", "thm3_4.gamma_scale", "thm3_4.control_blind", "thm3_6.alignment_rate"))


def test_cov_icl_gd_heads_approach_their_gd_targets(runs):
    metrics, claims, _ = load(runs["cov_icl_gd"])
    for head, n_max in (("single", 256), ("stack", 128)):
        cos = values(metrics, f"cos_{head}").set_index("n_demos")["value"]
        rel = values(metrics, f"rel_mse_{head}").set_index("n_demos")["value"]
        assert cos.index.max() == n_max
        assert cos[n_max] > 0.7 and cos[n_max] > cos[1] + 0.5
        assert rel[n_max] < 0.5 * rel[1]
        assert abs(values(metrics, f"cos_shuffled_{head}").set_index("n_demos")["value"][n_max]) < 0.2
    depth = values(metrics, "depth_rel_mse_stack")
    assert sorted(depth["layer"]) == list(range(1, 9))
    assert len(claims) == 11 and (claims[claims.comparison == "within"].paper_value == -1.0).all()


def test_cov_rate_slopes_and_iid_constant(runs):
    metrics, claims, _ = load(runs["cov_rate"])
    slopes = values(metrics, "slope")
    assert set(zip(slopes["variant"], slopes["rho"], strict=True)) == {("rho", 0.0), ("rho", 0.5), ("dim", 0.0)}
    assert slopes["value"].between(-1.25, -0.75).all()
    iid = values(metrics, "n_times_mse", rho=0.0).merge(values(metrics, "iid_constant_theory", rho=0.0),
                                                        on=["variant", "d"])
    assert np.allclose(iid["value_x"] / iid["value_y"], 1.0, atol=0.2)
    mse = values(metrics, "mse", variant="rho", rho=0.5).sort_values("n")["value"].to_numpy()
    assert mse[-1] < mse[0] / 20
    assert claims["passed"].dtype == bool
    # one claim per statement whatever (ρ, d) a preset scans: the worst stream is the one checked
    assert sorted(claims["id"]) == ["xu_fang.thm3_6." + k for k in (
        "constant_grows_with_tau", "constant_grows_with_trace", "iid_constant", "rate_slope")]
    worst = slopes["value"].iloc[(slopes["value"] + 1).abs().argmax()]
    assert claims.set_index("id").measured["xu_fang.thm3_6.rate_slope"] == pytest.approx(worst)


def test_markov_collapse_error_decays(runs):
    metrics, claims, _ = load(runs["markov_collapse"])
    for name in ("mse_estimated", "mse_exact"):
        curve = values(metrics, name, layer=2).sort_values("token_index")["value"].to_numpy()
        assert curve[-1] < curve[0] / 10
    blind = values(metrics, "mse_blind", layer=2).sort_values("token_index")["value"].to_numpy()
    est = values(metrics, "mse_estimated", layer=2).sort_values("token_index")["value"].to_numpy()
    assert blind[-1] > 2 * est[-1]
    assert values(metrics, "cov_rel_error")["value"].max() < 0.1
    assert len(claims) == 4


def test_bad_config_is_one_line_and_leaves_no_folder(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("run", "cov_rate", "rhos=[0.0,1.0]", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2
    assert "rhos" in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()
