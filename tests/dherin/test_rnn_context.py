"""rnn_context: the RNN block on random tensors, then end to end through the CLI at preset=smoke."""


import pandas as pd
import pytest
import torch

from experiments.core.results import CLAIM_COLUMNS
from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import prefix_patches
from experiments.dherin.models.linreg import predict
from experiments.dherin.models.rnn import rnn_block
from experiments.dherin.patched_forward import forward_with, patched_params, predictions_three_ways, supports_vmap
from tests.helpers.in_process import refusal

FIGURE = "fig6_rnn_context"
EXPERIMENT = "rnn_context"  # the shared smoke run (tests/helpers/smoke_runs.py)
SOURCE = "Dherin App. D.1 Fig 6"


def random_rnn_block(seed=0):
    torch.manual_seed(seed)
    return rnn_block(2, d_model=16, d_mlp=24).double().eval()


def test_rnn_contextual_layer_is_causal_and_token_wide():
    """Output (B, T, d+1); position t depends on tokens 1..t only (what the prefix patches assume)."""
    model = random_rnn_block()
    rng = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 9, 3, generator=rng, dtype=torch.float64)
    out = model.contextual(tokens)
    assert out.shape == (3, 9, 3)
    changed = tokens.clone()
    changed[:, 5:] += 1.0
    torch.testing.assert_close(model.contextual(changed)[:, :5], out[:, :5], rtol=0, atol=0)
    assert (model.contextual(changed)[:, 5:] - out[:, 5:]).abs().min() > 0


def test_patch_is_exact_for_the_rnn_block():
    """Theorem 2.2 with an RNN contextual layer, through the patched model's own forward, task by task."""
    model = random_rnn_block()
    assert not supports_vmap(model)  # nn.RNN has no batching rule: forward_with loops over tasks
    batch = sample_prompts(8, 30, 2, torch.Generator().manual_seed(1), torch.float64)
    patched = forward_with(model, patched_params(model, batch.tokens), batch.query)
    torch.testing.assert_close(patched[:, -1], model(batch.tokens)[:, -1], rtol=0, atol=1e-12)
    preds = predictions_three_ways(model, batch.tokens)
    torch.testing.assert_close(preds["patched"], predict(model(batch.tokens)), rtol=0, atol=1e-12)
    assert (preds["no_context"] - preds["context"]).abs().mean() > 1e-3


def test_prefix_patches_reproduce_every_prefix_for_the_rnn():
    """dynamics.prefix_patches works unchanged on the RNN block: Φ_{W+(ΔW)_i}(x) = Φ_W(C_i, x)."""
    model = random_rnn_block()
    batch = sample_prompts(3, 12, 2, torch.Generator().manual_seed(2), torch.float64)
    patches = prefix_patches(model, batch.tokens)  # (B, N, d_mlp, d+1)
    assert patches.shape == (3, 12, 24, 3)
    for i in (1, 5, 12):
        prefix = torch.cat([batch.tokens[:, :i], batch.query], dim=1)
        W = {"mlp.w1.weight": model.mlp.w1.weight + patches[:, i - 1]}
        torch.testing.assert_close(forward_with(model, W, batch.query)[:, -1], model(prefix)[:, -1],
                                   rtol=0, atol=1e-12)


def test_draws_the_papers_figure(smoke_run):
    """The paper's figure by name (every figure is checked drawn, with its PDF, by the contract test)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file()


def test_losses_agree_both_ways_and_the_control_does_not(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    assert (m.experiment == "rnn_context").all()
    assert (m.nonlinearity == "relu").all()  # the default RNN
    assert sorted(m[m.metric == "train_loss"].step) == list(range(1, 31))
    val = m[m.metric.str.startswith("val_loss")].pivot_table(index="step", columns="metric", values="value")
    assert list(val.index) == [0, 10, 20, 30]
    rel = (val.val_loss_context - val.val_loss_patched).abs() / val.val_loss_context
    assert rel.max() < 1e-5
    assert (m[m.metric == "val_max_abs_diff"].value < 1e-5).all()
    assert ((val.val_loss_no_context - val.val_loss_context).abs() / val.val_loss_context).min() > 1e-4


def test_increments_for_both_contextual_layers(smoke_run):
    """Fig. 6 right: ‖(ΔW)_(i+1) − (ΔW)_i‖₂ for i = 1..N−1 and 8 tasks, RNN beside attention."""
    m = pd.read_csv(smoke_run / "metrics.csv")
    inc = m[m.metric == "increment_norm_op2"]
    for layer in ("rnn", "attention"):
        for variant in ("trained", "untrained"):  # beside each trained model, its control at initialisation
            s = inc[(inc.contextual == layer) & (inc.variant == variant)]
            assert len(s) == 8 * 19 and sorted(s.context_length.unique()) == list(range(1, 20))
            assert (s.value > 0).all() and s.value.notna().all()
    ratios = m[m.metric == "decay_ratio_tail_to_head"].set_index(["contextual", "variant"]).value
    assert set(ratios.index) == {(c, v) for c in ("rnn", "attention") for v in ("trained", "untrained")}
    # the ratio is recomputable from the per-task rows (what the claims use): tail 2 of 19 over head 2
    rnn = inc[(inc.contextual == "rnn") & (inc.variant == "trained")].groupby("context_length").value.mean()
    assert ratios["rnn", "trained"] == pytest.approx(rnn.iloc[-2:].mean() / rnn.iloc[:2].mean(), rel=1e-9)


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    assert list(c.columns) == CLAIM_COLUMNS and len(c) == 7
    passed = dict(zip(c.id, c.passed, strict=True))
    assert passed["dherin.fig6.val_loss_context_equals_patch"] and passed["dherin.fig6.patch_equals_context"]
    assert passed["dherin.fig6.control_far_off"]
    learned = c.set_index("id").loc["dherin.fig6.model_learned"]
    assert not learned.passed and learned.measured > 0.5  # 30 steps do not teach the task; it says so
    m = pd.read_csv(smoke_run / "metrics.csv")
    r = m[m.metric == "decay_ratio_tail_to_head"].set_index(["contextual", "variant"]).value
    by_id = c.set_index("id").measured  # each judged against the untrained models
    contrast = (r["rnn", "trained"] / r["attention", "trained"]) / (r["rnn", "untrained"] / r["attention", "untrained"])
    assert by_id["dherin.fig6.rnn_increments_do_not_decay"] == pytest.approx(contrast)
    assert by_id["dherin.fig6.attention_increments_decay"] == pytest.approx(
        r["attention", "trained"] / r["attention", "untrained"])


def test_attention_checkpoint_from_a_linreg_icl_run(icl, tmp_path, smoke_runs):
    """attention.checkpoint=PATH loads linreg_icl's saved model (the session's shared smoke run) instead of
    training one here; a missing file is refused before a run folder exists."""
    lin = smoke_runs("linreg_icl")
    run_dir = tmp_path / "run"
    proc = icl("run", "rnn_context", "preset=smoke", "train.steps=5", f"attention.checkpoint={lin / 'model.pt'}",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = pd.read_csv(run_dir / "claims.csv")
    assert c.description.str.contains("attention model \\(loaded\\)").any()
    assert "no such file" in refusal("rnn_context", tmp_path / "bad", f"attention.checkpoint={tmp_path / 'nope.pt'}")


@pytest.mark.parametrize("override, message", [
    ("model.nonlinearity=gelu", "model.nonlinearity='gelu' is not one of tanh, relu"),  # the schema's Enum
    ("task.n_examples=2", "contexts longer than 2"),
    ("dynamics.tail_fraction=0.9", "dynamics.tail_fraction=0.9 must be in (0, 0.5]"),
])
def test_bad_values_are_refused_before_a_run_folder_exists(tmp_path, override, message):
    assert message in refusal("rnn_context", tmp_path / "run", override)
