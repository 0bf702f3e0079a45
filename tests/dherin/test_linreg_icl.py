"""linreg_icl end to end through the CLI at preset=smoke, asserting on its CSVs (the run folder contract:
tests/core/test_run_folder_contract.py)."""

import json

import pandas as pd
import yaml

from experiments.core.results import CLAIM_COLUMNS

FIGURE = "fig2_linreg_icl"
EXPERIMENT = "linreg_icl"  # the shared smoke run, with seed=3 (tests/helpers/smoke_runs.py)


def test_the_run_records_its_seed_and_the_smoke_preset(smoke_run):
    """What run.json and .hydra/ say of this run's choices (the contract test checks the rest of the folder)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file()
    record = json.loads((smoke_run / "run.json").read_text())
    assert record["seed"] == 3 and record["dtype"] == "float32" and record["device"] == "cpu"
    assert "seed=3" in record["overrides"]
    cfg = yaml.safe_load((smoke_run / ".hydra/config.yaml").read_text())
    assert cfg["train"]["steps"] == 30 and cfg["task"]["n_examples"] == 20  # the smoke preset applied


def test_metrics_are_tidy_and_complete(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    assert list(m.columns[:4]) == ["experiment", "run_id", "metric", "value"]
    assert (m["experiment"] == "linreg_icl").all() and m["run_id"].nunique() == 1
    train = m[m.metric == "train_loss"]
    assert sorted(train.step) == list(range(1, 31))
    checkpoints = m[m.metric == "val_loss_context"].step.tolist()
    assert checkpoints == [0, 10, 20, 30]
    for name in ("val_loss_patched", "val_loss_no_context", "val_max_abs_diff", "val_loss_zero_predictor"):
        assert m[m.metric == name].step.tolist() == checkpoints, name
    val = m[m.metric.str.startswith("val_loss")].pivot_table(index="step", columns="metric", values="value")
    # with context and via ΔW agree; the control (no context, no patch) does not
    rel = (val.val_loss_context - val.val_loss_patched).abs() / val.val_loss_context
    assert rel.max() < 1e-4
    assert (m[m.metric == "val_max_abs_diff"].value < 1e-4).all()
    assert ((val.val_loss_no_context - val.val_loss_context).abs() / val.val_loss_context).min() > 1e-3
    grid = m[m.metric == "grid_abs_diff_patched"]
    assert len(grid) == 36 and grid.x1.nunique() == 6 and (grid.x1 != 0).all()
    assert grid.value.max() < 1e-5
    ctrl = m[m.metric == "grid_abs_diff_no_context"]
    assert ctrl.value.mean() > 1e3 * grid.value.mean()


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    assert list(c.columns) == CLAIM_COLUMNS
    passed = dict(zip(c.id, c.passed, strict=True))
    assert sorted(passed) == sorted(["dherin.fig2.val_loss_context_equals_patch", "dherin.fig2.patch_equals_context",
                                     "dherin.fig2.control_far_off", "dherin.sec4_1.model_learned"])
    assert passed["dherin.fig2.val_loss_context_equals_patch"] and passed["dherin.fig2.patch_equals_context"]
    assert passed["dherin.fig2.control_far_off"]
    assert c.set_index("id").paper_value["dherin.fig2.patch_equals_context"] == 1e-7
    # 30 steps do not teach the task: the claim says so rather than pretending
    learned = c.set_index("id").loc["dherin.sec4_1.model_learned"]
    assert not learned.passed and learned.measured > 0.1


def test_mlp_skip_and_float64(icl, tmp_path):
    """Theorem B.2's block (ΔW and Δb′ = δA) and a float64 run, where 'equal' means 1e-13."""
    run_dir = tmp_path / "run"
    proc = icl("run", "linreg_icl", "preset=smoke", "model.mlp_skip=true", "dtype=float64",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = pd.read_csv(run_dir / "metrics.csv")
    assert m[m.metric == "grid_abs_diff_patched"].value.max() < 1e-12
    assert m[m.metric == "val_max_abs_diff"].value.max() < 1e-12
    assert (m.dtype == "float64").all() and m.mlp_skip.all()


def test_multirun_of_two_seeds_is_combined(icl, tmp_path):
    sweep = tmp_path / "sweep"
    proc = icl("run", "linreg_icl", "-m", "preset=smoke", "seed=0,1", "train.steps=10", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "run.json").exists())
    assert jobs == ["0", "1"]
    seeds = [json.loads((sweep / j / "run.json").read_text())["seed"] for j in jobs]
    assert seeds == [0, 1]
    combined = pd.read_csv(sweep / "claims.csv")  # a sweep over seeds alone: one row per claim, over both seeds
    per_job = [pd.read_csv(sweep / j / "claims.csv") for j in jobs]
    assert combined.id.is_unique and set(combined.id) == set(per_job[0].id)
    assert (combined.n_seeds == 2).all() and (combined.seeds.astype(str) != "").all()
    assert (sweep / "figures" / f"{FIGURE}.png").is_file()
    (sweep / "figures" / f"{FIGURE}.png").unlink()
    proc = icl("plot", str(sweep))
    assert proc.returncode == 0, proc.stderr
    assert (sweep / "figures" / f"{FIGURE}.png").is_file()
    m0 = pd.read_csv(sweep / "0" / "metrics.csv")
    m1 = pd.read_csv(sweep / "1" / "metrics.csv")
    assert m0.run_id.iloc[0] != m1.run_id.iloc[0]
    assert not m0[m0.metric == "train_loss"].value.equals(m1[m1.metric == "train_loss"].value)


def test_heat_map_colorbars_say_what_they_measure():
    """The patch error and the control differ by ~1e7: each colorbar carries its own label."""
    import matplotlib.pyplot as plt

    from experiments.dherin.linreg_icl.run import _heat

    frame = pd.DataFrame({"x1": [-1.0, -1.0, 1.0, 1.0], "x2": [-1.0, 1.0, -1.0, 1.0],
                          "value": [1e-8, 2e-8, 3e-8, 4e-8]})
    fig, ax = plt.subplots()
    _heat(fig, ax, frame, "title", "patch error, mean |difference|")
    colorbar = [a for a in fig.axes if a is not ax][0]
    assert colorbar.get_ylabel() == "patch error, mean |difference|"
    plt.close(fig)


def test_error_bars_say_what_they_are():
    from experiments.dherin.loss_panels import _bars

    two_seeds = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "value": [1, 2, 3, 4]})
    assert "mean ± s.e.m. over n = 2 runs" in _bars(two_seeds)
    assert "one run" in _bars(two_seeds[two_seeds.run_id == "a"])
