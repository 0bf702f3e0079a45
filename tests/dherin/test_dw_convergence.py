"""dw_convergence end to end through the CLI at preset=smoke, asserting on its CSVs; checkpoint loading."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.data.linreg import sample_prompts
from experiments.dherin.dw_convergence.run import dynamics_errors
from experiments.dherin.dynamics import (
    decay_summary,
    decay_vs_control,
    prefix_contextual_outputs,
    prefix_patches_from_outputs,
    prop31_deltas,
    prop31_step,
)
from experiments.dherin.models.linreg import attention_block

FIGURE = "fig3_dw_convergence"
EXPERIMENT = "dw_convergence"  # the shared smoke run, with seed=3 (tests/helpers/smoke_runs.py)
N, TASKS = 20, 12  # the smoke preset's context length and task count


def test_draws_the_papers_figure_saves_its_model_and_records_the_seed(smoke_run):
    """The paper's figure by name, the trained model, and the seed given (the contract test checks the rest)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file() and (smoke_run / "model.pt").is_file()
    assert json.loads((smoke_run / "run.json").read_text())["seed"] == 3


def test_increments_of_every_prefix_are_recorded(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    for variant in ("trained", "untrained"):
        for norm in ("op2", "fro"):
            rows = m[(m.metric == f"increment_norm_{norm}") & (m.variant == variant)]
            assert len(rows) == TASKS * (N - 1), (variant, norm)
            assert sorted(rows.context_length.unique()) == list(range(1, N))
            assert rows.task.nunique() == TASKS and (rows.value > 0).all()
    # §3's increments are rank-1: their 2-norm is their Frobenius norm
    op2 = m[m.metric == "increment_norm_op2"].value.to_numpy()
    fro = m[m.metric == "increment_norm_fro"].value.to_numpy()
    np.testing.assert_allclose(op2, fro, rtol=1e-4)
    assert (m[m.metric == "rank1_norm_gap"].value < 1e-4).all()
    assert len(m[m.metric == "patch_norm_fro"]) == TASKS * N


def test_prop31_and_prefix_patches_are_exact_beside_their_controls(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    err = m[m.metric == "prop31_max_abs_err"]
    assert sorted(err.context_length) == list(range(1, N + 1))  # after every number of steps i = 1..N
    assert err.value.max() < 1e-5
    patch, ctrl = m[m.metric == "patch_max_abs_err"], m[m.metric == "no_context_max_abs_diff"]
    assert sorted(patch.context_length) == list(range(1, N + 1))
    assert patch.value.max() < 1e-5 and ctrl.value.min() > 1e-3


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    passed = dict(zip(c.id, c.passed, strict=True))
    exact = c[c.id.str.startswith(("dherin.prop3_1.", "dherin.sec3."))]
    assert len(exact) == 4 and exact.passed.all(), passed
    learned = c.set_index("id").loc["dherin.sec4_1.model_learned"]
    assert not learned.passed and learned.measured > 0.1  # 30 steps do not teach the task
    decay = c[c.id.isin(["dherin.fig3.increments_decay", "dherin.fig3.increments_power_law"])]
    assert len(decay) == 2
    # both decay claims carry their control: the untrained model's ratio and slope are in them
    ratios = pd.read_csv(smoke_run / "metrics.csv")
    m_ratios = ratios[ratios.metric == "decay_ratio_tail_to_head"].set_index("variant").value
    m_slopes = ratios[ratios.metric == "decay_fit_slope"].set_index("variant").value
    controlled = c.set_index("id").loc["dherin.fig3.increments_decay"]
    assert controlled.measured == pytest.approx(m_ratios["trained"] / m_ratios["untrained"], rel=1e-6)
    assert not controlled.passed  # 30 steps: trained and untrained decay alike, and the claim says so
    slope = c.set_index("id").loc["dherin.fig3.increments_power_law"]
    assert slope.measured == pytest.approx(m_slopes["trained"] - m_slopes["untrained"], rel=1e-6)
    assert not slope.passed
    # the decay claim is the summary of the logged curves, not a separate number
    m = pd.read_csv(smoke_run / "metrics.csv")
    ratio = {}
    for variant in ("trained", "untrained"):
        rows = m[(m.metric == "increment_norm_op2") & (m.variant == variant)]
        curve = rows.groupby("context_length").value.mean().to_numpy()
        ratio[variant] = decay_summary(curve, 0.1)["decay_ratio_tail_to_head"]
    assert controlled.measured == pytest.approx(ratio["trained"] / ratio["untrained"], rel=1e-6)


def test_decay_summary_of_a_power_law():
    i = np.arange(1, 200)
    s = decay_summary(3.0 * i ** -1.0, 0.1)
    assert s["decay_fit_slope"] == pytest.approx(-1.0, abs=1e-9)
    assert s["decay_ratio_tail_to_head"] < 0.05
    flat = decay_summary(np.ones(50), 0.1)
    assert flat["decay_ratio_tail_to_head"] == pytest.approx(1.0) and abs(flat["decay_fit_slope"]) < 1e-9


def test_checkpoint_loads_the_same_weights(smoke_run, icl, tmp_path):
    """checkpoint=RUN_DIR: no training, and the loaded model's validation loss is the trained one's."""
    run_dir = tmp_path / "loaded"
    proc = icl("run", "dw_convergence", "preset=smoke", "seed=3", f"checkpoint={smoke_run}", "dynamics.n_tasks=3",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained, loaded = pd.read_csv(smoke_run / "metrics.csv"), pd.read_csv(run_dir / "metrics.csv")
    assert not (run_dir / "model.pt").exists()
    val = loaded[loaded.metric == "val_loss_context"]
    assert val.step.tolist() == [-1]
    final = trained[trained.metric == "val_loss_context"].sort_values("step").value.iloc[-1]
    assert val.value.iloc[0] == pytest.approx(final, rel=1e-6)
    assert len(loaded[(loaded.metric == "increment_norm_op2") & (loaded.variant == "trained")]) == 3 * (N - 1)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nowhere", "no such file"),
    (lambda d: (d / "junk.pt").write_text("not a checkpoint") and d / "junk.pt", "not a linreg_icl checkpoint"),
])
def test_bad_checkpoint_is_a_one_line_error(icl, tmp_path, make, message):
    path = make(tmp_path)
    run_dir = tmp_path / "run"
    proc = icl("run", "dw_convergence", "preset=smoke", f"checkpoint={path}", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not run_dir.exists()


def test_decay_vs_control_fails_when_both_decay_alike():
    i = np.arange(1, 50)
    assert decay_vs_control(1 / i, 1 / i, 0.1) == pytest.approx(1.0)  # the claim (<= 0.5) fails
    assert decay_vs_control(1 / i ** 2, 1 / i, 0.1) < 0.5  # decays faster than the control: it passes


def _model(seed):
    torch.manual_seed(seed)
    return attention_block(2, d_model=8, n_heads=2, d_mlp=16).double()


def test_prop31_claim_is_judged_by_forward_passes_and_fails_on_a_wrong_loss():
    """Prop. 3.1's steps from W_0 reproduce the model's with-prefix outputs; with Δ_i built from another
    model's contextual outputs (the wrong loss) they do not. The old check (the step formula against patches
    made from the same numbers) passes on the wrong input too: it compared a formula with itself."""
    model = _model(0)
    tokens = sample_prompts(4, 6, 2, torch.Generator().manual_seed(0), dtype=torch.float64).tokens
    right = prefix_contextual_outputs(model.contextual, tokens)
    errors = dynamics_errors(model, tokens, right, chunk=64)
    assert errors["prop31"].max() < 1e-12 and errors["patch"].max() < 1e-12
    assert errors["control"].min() > 1e-4
    wrong = prefix_contextual_outputs(_model(1).contextual, tokens)
    bad = dynamics_errors(model, tokens, wrong, chunk=64)
    assert bad["prop31"].max() > 1e-3 and bad["patch"].max() > 1e-3
    W0 = model.mlp.w1.weight
    old_lhs = torch.cat([W0.expand(4, 1, *W0.shape), W0 + prefix_patches_from_outputs(W0, wrong)], dim=1)
    old_rhs = prop31_step(old_lhs[:, :-1], prop31_deltas(W0, wrong), wrong[:, :1].expand(4, 6, 3))
    assert (old_rhs - old_lhs[:, 1:]).abs().max() < 1e-12  # the old claim would have passed
