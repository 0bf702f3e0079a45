"""wq_reparam, attention_scale and basis_transfer end to end through the real CLI at preset=smoke
(asserting on their CSVs), their claims shown failing on deliberately wrong inputs, and bad input
refused in one line before any run folder exists."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.core.results import RunContext
from tests.helpers.cli import run_cli
from tests.helpers.in_process import compose

EXPERIMENTS = ("wq_reparam", "attention_scale", "basis_transfer")


@pytest.fixture(scope="module")
def runs(smoke_runs) -> dict[str, Path]:
    """The session's shared smoke runs of the three (tests/helpers/smoke_runs.py)."""
    return {name: smoke_runs(name) for name in EXPERIMENTS}


def load(run_dir: Path):
    return (pd.read_csv(run_dir / "metrics.csv"), pd.read_csv(run_dir / "claims.csv").set_index("id"),
            json.loads((run_dir / "run.json").read_text()))


def test_wq_reparam_exact_statements_and_failing_controls(runs):
    metrics, claims, _ = load(runs["wq_reparam"])
    rel = metrics[metrics["metric"] == "rel_error"]
    exact = rel[(rel["kind"] == "exact") & (rel["role"] == "construction")]
    controls = rel[(rel["kind"] == "exact") & (rel["role"] == "control")]
    assert exact["statement"].nunique() == 12 and exact["value"].max() < 1e-10
    assert controls["value"].min() > 1e-3
    obstructions = rel[(rel["kind"] == "obstruction") & (rel["role"] == "construction")]
    assert set(obstructions["statement"]) == {"remark1.all_layers_both_skips_fails", "remark4.tied_head_fails",
                                              "remark7.layernorm_model_fails", "cor8_4_1.no_fit_generic"}
    assert obstructions["value"].min() > 1e-3
    assert claims["passed"].all(), claims[~claims["passed"]]
    assert claims.loc["karbevski.sec3_1.attention_params_saved", "measured"] == pytest.approx(0.25)
    assert (runs["wq_reparam"] / "figures" / "wq_reparam_table.md").read_text().count("| exact |") == 12


def test_attention_scale_reproduces_the_derivation(runs):
    metrics, claims, _ = load(runs["attention_scale"])
    assert claims["passed"].all(), claims[~claims["passed"]]
    ratio = metrics[(metrics["metric"] == "ratio") & (metrics["sweep"] == "nanogpt")]
    assert set(ratio["inputs"]) == {"unit_norm", "layernorm"}
    assert ratio["value"].mean() == pytest.approx(1.80, abs=0.05)
    sq = metrics[(metrics["metric"] == "mean_sq_norm") & (metrics["inputs"] == "layernorm")]["value"]
    assert sq.iloc[0] > 700  # LayerNorm outputs have ‖x‖² ≈ d, not the paper's 1


def test_basis_transfer_writes_fig2_rows(runs):
    metrics, claims, _ = load(runs["basis_transfer"])
    rel = metrics[metrics["metric"] == "rel_l2"]
    assert set(rel["model"]) == {"mlp", "linear", "mlp_init"} and sorted(rel["h"].unique()) == [8, 16]
    linear = rel[rel["model"] == "linear"]["value"]
    assert linear.between(0.05, 0.2).all()  # the optimal linear map is a fit, whatever the training did
    assert len(claims) == 8 and "karbevski.fig2.mlp_beats_linear" in claims.index
    assert metrics[metrics["metric"] == "train_rel_sq_error"]["step"].max() == 200


# -- claims fail on wrong input ----------------------------------------------------------------

def ctx(tmp_path) -> RunContext:
    return RunContext(run_dir=tmp_path, experiment="x", run_id="r")


def test_wq_claims_fail_when_a_construction_is_off(tmp_path):
    from experiments.karbevski.wq_reparam import run as wq

    cfg = compose("wq_reparam", preset="paper")
    good = {"error": 1e-15, "control": 1.0, "scale": 1.0, "condition": 0.0, "condition_generic": 1.0}
    obstruction = dict(good, error=1.0, control=1e-15)  # the obstruction shows, its exact counterpart holds
    results = {f"{r}.{w}": [good] for r, w, *_ in wq.EXACT}
    results |= {f"{r}.{w}": [obstruction] for r, w, *_ in wq.OBSTRUCTIONS}
    results["thm4_1.single_layer_exact"] = [dict(good, error=1e-6)]  # a construction off by 1e-6
    results["remark1.all_layers_both_skips_fails"] = [dict(obstruction, error=0.0)]  # an obstruction that vanished
    lemma84 = [{"error": 0.1, "control": 0.0}]
    remark5 = [{"d": 8, "deviation": 0.2}, {"d": 64, "deviation": 0.25}]  # not improving with d
    counts = {"toy": ({"attention": 4}, {"attention": 4}), "nanogpt": ({"total": 10}, {"total": 10}),
              "reduced_error": 1e-15}
    c = ctx(tmp_path)
    wq.check_claims(c, cfg, results, lemma84, remark5, counts)
    failed = set(c.claims().query("not passed")["id"])
    assert failed == {"karbevski.thm4_1.single_layer_exact", "karbevski.remark1.all_layers_both_skips_fails",
                      "karbevski.remark5.linearity_improves_with_d", "karbevski.sec3_1.attention_params_saved",
                      "karbevski.table2.params_saved_millions"}


def test_attention_claims_fail_for_a_wrong_ratio(tmp_path):
    import numpy as np

    from experiments.karbevski.attention_scale import run as at

    cfg = compose("attention_scale", preset="paper")
    same = {"baseline": np.array([0.0032]), "wq_identity": np.array([0.0032]), "sq_norm": np.array([1.0]),
            "theory": {"baseline": 0.0032, "wq_identity": 0.0058}, "ratio": 1.0}
    results = {("nanogpt", 768, 12, "unit_norm"): same, ("nanogpt", 768, 12, "layernorm"): same,
               ("d_model", 768, 12, "unit_norm"): same}
    c = ctx(tmp_path)
    at.check_claims(c, cfg, results)
    failed = set(c.claims().query("not passed")["id"])
    assert {"karbevski.app8_1.wq_identity_std_unit_norm", "karbevski.app8_1.ratio_unit_norm",
            "karbevski.app8_1.ratio_is_inverse_sigma_sqrt_d"} <= failed
    # the corrective factor 1/1.8 is 1 / ratio_unit_norm: logged, not checked a second time
    assert "karbevski.app8_1.corrective_factor" not in set(c.claims()["id"])


def test_basis_claims_fail_when_the_mlp_loses(tmp_path):
    from experiments.karbevski.basis_transfer import run as bt

    cfg = compose("basis_transfer", preset="paper")
    rows = []
    for h in (8, 16):
        for model, rel, cos in (("mlp", 0.2, 0.02), ("linear", 0.1, 0.01), ("mlp_init", 0.3, 0.5)):
            rows += [dict(metric="rel_l2", value=rel, model=model, h=h),
                     dict(metric="cosine_distance", value=cos, model=model, h=h)]
    c = ctx(tmp_path)
    bt.check_claims(c, cfg, pd.DataFrame(rows))
    failed = set(c.claims().query("not passed")["id"])
    assert {"karbevski.fig2.mlp_beats_linear", "karbevski.fig2.training_beats_init", "karbevski.fig2.mlp_rel_l2",
            "karbevski.fig2.mlp_cosine_distance"} <= failed


def _fig2_claims(tmp_path, mlp: float, linear: float):
    from experiments.karbevski.basis_transfer import run as bt

    cfg = compose("basis_transfer", preset="paper")
    rows = []
    for h in (8, 16):
        for model, rel, cos in (("mlp", mlp, 0.002), ("linear", linear, 0.01), ("mlp_init", 1.0, 0.5)):
            rows += [dict(metric="rel_l2", value=rel, model=model, h=h),
                     dict(metric="cosine_distance", value=cos, model=model, h=h)]
    c = ctx(tmp_path)
    bt.check_claims(c, cfg, pd.DataFrame(rows))
    return c.claims().set_index("id")["passed"]


def test_mlp_beats_linear_is_judged_at_the_papers_factor_of_two(tmp_path):
    assert _fig2_claims(tmp_path, mlp=0.045, linear=0.10)["karbevski.fig2.mlp_beats_linear"]
    # better than linear, but by 0.72, not 1/2 (what preset=cpu measures): the old bar of 1 passed it
    assert not _fig2_claims(tmp_path, mlp=0.072, linear=0.10)["karbevski.fig2.mlp_beats_linear"]


def test_linear_error_is_judged_against_one_reading_at_a_time(tmp_path):
    ids = ["karbevski.fig2.linear_rel_l2_text", "karbevski.fig2.linear_rel_l2_caption"]
    assert list(_fig2_claims(tmp_path, mlp=0.05, linear=0.095)[ids]) == [True, False]  # the text's 9-10 %
    assert list(_fig2_claims(tmp_path, mlp=0.05, linear=0.125)[ids]) == [False, True]  # the caption's 11-14 %
    # 10.5 %: inside the old union band (9-14 %), in neither reading
    assert not _fig2_claims(tmp_path, mlp=0.05, linear=0.105)[ids].any()


def test_parameter_claims_fail_for_the_invalid_reduction(tmp_path, monkeypatch):
    """W_Q dropped and nothing adjusted (reparam.drop_queries) removes 25 % of the attention parameters by
    construction; the forward pass of that model is not the original's, so nothing counts as saved."""
    from experiments.karbevski import reparam
    from experiments.karbevski.wq_reparam import run as wq_reparam
    from tests.helpers.in_process import run_claims

    ids = ["karbevski.sec3_1.attention_params_saved", "karbevski.table2.params_saved_millions"]
    assert run_claims("wq_reparam", tmp_path / "real").loc[ids, "passed"].all()
    monkeypatch.setattr(wq_reparam, "REDUCE", reparam.drop_queries)
    broken = run_claims("wq_reparam", tmp_path / "dropped")
    assert not broken.loc[ids, "passed"].any()


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, args, message", [
    ("wq_reparam", ["wq_rank=10"], "GL(d)"),
    ("attention_scale", ["heads=7"], "not divisible by heads=7"),
    ("basis_transfer", ["widths=[]"], "non-empty"),
])
def test_bad_input_is_one_line_and_no_folder(tmp_path, name, args, message):
    out = tmp_path / "run"
    result = run_cli("run", name, "preset=smoke", *args, f"hydra.run.dir={out}")
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.parametrize("name, override, message", [
    ("wq_reparam", {"heads": 5}, "not divisible by heads=5"),
    ("wq_reparam", {"relu": {"h": 1}}, "h ≥ 2"),
    ("wq_reparam", {"relu": {"m": 20}}, "2^m"),
    ("attention_scale", {"sweep": {"heads": [5]}}, "does not divide"),
    ("attention_scale", {"sweep": {"d_models": [100]}}, "not a multiple"),
    ("basis_transfer", {"ridge": {"samples": 4}}, "underdetermined"),
])
def test_validate_refuses_in_one_line(name, override, message):
    from experiments.core.errors import UserError
    from experiments.core.registry import get

    cfg = OmegaConf.merge(compose(name, preset="paper"), override)
    with pytest.raises(UserError, match=message.replace("^", r"\^")) as err:
        get(name).validate(cfg)
    assert "\n" not in str(err.value)


def test_basis_transfer_warns_with_the_expected_time_on_cpu(tmp_path, caplog):
    """preset=paper without a GPU runs on CPU after a warning of the expected time (here forced by
    warn_after_s=0 on the smoke sizes, so the test stays seconds)."""
    import torch

    from experiments.karbevski.basis_transfer import run as bt

    cfg = OmegaConf.merge(compose("basis_transfer", preset="smoke"),
                          {"seed": 0, "preset": "paper", "warn_after_s": 0, "widths": [4], "train": {"steps": 5}})
    c = ctx(tmp_path)
    c.device, c.dtype = torch.device("cpu"), torch.float32
    with caplog.at_level("WARNING"):
        bt.run(cfg, c)
    assert any("expect about" in r.message and "GPU" in r.message for r in caplog.records)
    assert bt.expected_seconds(compose("basis_transfer", preset="paper"), c.device, c.dtype) > 3600
