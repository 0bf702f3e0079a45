"""multilayer_ln end to end through the CLI at preset=smoke, asserting on its CSVs."""


import pandas as pd
import pytest

from experiments.core.results import CLAIM_COLUMNS
from tests.helpers.in_process import refusal

FIGURE = "fig5_multilayer_ln"
EXPERIMENT = "multilayer_ln"  # the shared smoke run (tests/helpers/smoke_runs.py)
SOURCE = "Dherin App. C.1 Fig 5"


def test_draws_the_papers_figure(smoke_run):
    """The paper's figure by name (every figure is checked drawn, with its PDF, by the contract test)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file()


def test_losses_agree_both_ways_and_the_control_does_not(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    assert (m.experiment == "multilayer_ln").all()
    assert sorted(m[m.metric == "train_loss"].step) == list(range(1, 21))
    val = m[m.metric.str.startswith("val_loss")].pivot_table(index="step", columns="metric", values="value")
    assert list(val.index) == [0, 10, 20]
    rel = (val.val_loss_context - val.val_loss_patched).abs() / val.val_loss_context
    assert rel.max() < 1e-5
    assert (m[m.metric == "val_max_abs_diff"].value < 1e-5).all()
    assert ((val.val_loss_no_context - val.val_loss_context).abs() / val.val_loss_context).min() > 1e-3
    assert (m[m.metric == "train_loss"].removed == 20).all()  # Y = all N = 20 examples by default


def test_every_block_matches_at_rounding_level(smoke_run):
    """Fig. 5 right: 16 tasks × 3 blocks; float32 block outputs of norm ≈ √d_model agree to ~1e-6."""
    m = pd.read_csv(smoke_run / "metrics.csv")
    diff = m[m.metric == "block_l2_diff_patched"]
    ctrl = m[m.metric == "block_l2_diff_no_context"]
    norm = m[m.metric == "block_l2_norm"]
    assert len(diff) == len(ctrl) == len(norm) == 16 * 3
    assert sorted(diff.layer.unique()) == [1, 2, 3] and diff.task.nunique() == 16
    per_layer = diff.groupby("layer").value.mean()
    assert per_layer.max() < 5e-6
    assert (ctrl.groupby("layer").value.mean() > 1e3 * per_layer).all()
    assert norm.value.between(1, 20).all()  # LayerNorm outputs: the scale the differences are measured at


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    assert list(c.columns) == CLAIM_COLUMNS and len(c) == 4
    passed = dict(zip(c.id, c.passed, strict=True))
    assert passed["dherin.fig5.val_loss_context_equals_patch"] and passed["dherin.fig5.block_outputs_equal"]
    assert passed["dherin.fig5.control_far_off"]
    learned = c.set_index("id").loc["dherin.fig5.model_learned"]
    assert not learned.passed and learned.measured > 0.1  # 20 steps do not teach the task; it says so


def test_partial_removal_in_float64(icl, tmp_path):
    """patch.remove_first=k: Y = the first k examples only; the stack then still reads the rest."""
    run_dir = tmp_path / "run"
    proc = icl("run", "multilayer_ln", "preset=smoke", "patch.remove_first=7", "dtype=float64", "train.steps=5",
               "eval.n_val_tasks=16", "eval.block_tasks=4", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = pd.read_csv(run_dir / "metrics.csv")
    assert (m.removed == 7).all() and (m.dtype == "float64").all()
    assert m[m.metric == "block_l2_diff_patched"].value.max() < 1e-12
    assert m[m.metric == "val_max_abs_diff"].value.max() < 1e-12
    assert m[m.metric == "block_l2_diff_no_context"].value.min() > 1e-6


@pytest.mark.parametrize("override, message", [
    ("patch.remove_first=0", "patch.remove_first=0 must be null"),
    ("patch.remove_first=21", "1..task.n_examples=20"),
    ("model.n_heads=5", "must be divisible by model.n_heads=5"),
])
def test_bad_values_are_refused_before_a_run_folder_exists(tmp_path, override, message):
    assert message in refusal("multilayer_ln", tmp_path / "run", override)
