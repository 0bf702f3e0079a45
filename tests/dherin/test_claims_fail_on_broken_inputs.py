"""Each Dherin claim given a broken input that a weaker check would pass: it must fail. The real input is
checked where the smoke preset can show it; elsewhere check_claims is
fed synthetic curves that do and do not show the effect."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf

from experiments.core.results import RunContext
from tests.helpers.in_process import run_claims


def _ctx(tmp_path) -> RunContext:
    return RunContext(run_dir=tmp_path, experiment="x", run_id="r")


def test_dw_prediction_claim_fails_when_a_is_noise(tmp_path, monkeypatch):
    """A(C_i, x) replaced by Gaussian noise × 5: ΔW is then built from the wrong outputs. Were both sides of
    the claim computed from that same A they would agree however wrong A is; the context side is the model's
    own forward pass on [C_i, x_test], so the claim fails."""
    from experiments.dherin.finetune_compare import run as fc

    real = fc.prefix_contextual_outputs

    def noise(contextual, tokens):
        a = real(contextual, tokens)
        return 5 * torch.randn(a.shape, generator=torch.Generator().manual_seed(0), dtype=a.dtype)

    claim = "dherin.cor2_5_1.dw_prediction_equals_context"
    assert run_claims("finetune_compare", tmp_path / "real").loc[claim, "passed"]
    monkeypatch.setattr(fc, "prefix_contextual_outputs", noise)
    broken = run_claims("finetune_compare", tmp_path / "noise").loc[claim]
    assert not broken["passed"] and broken["measured"] > 1e-2


def _decaying(n: int, slope: float) -> np.ndarray:
    i = np.arange(1, n + 1, dtype=float)
    return i**slope


def test_fig3_decay_claims_are_judged_against_the_untrained_model(tmp_path):
    from experiments.dherin.dw_convergence.run import check_claims

    cfg = OmegaConf.create({"dynamics": {"tail_fraction": 0.1}})
    e = {k: torch.tensor([1e-7]) for k in ("prop31", "patch")} | {"control": torch.tensor([1.0]),
                                                                    "output_scale": torch.tensor(1.0)}
    ids = ["dherin.fig3.increments_decay", "dherin.fig3.increments_power_law"]
    learned = _ctx(tmp_path)  # trained increments fall like i^-1.5, the untrained ones like i^-0.3
    check_claims(learned, cfg, torch.float32, e, {"trained": _decaying(40, -1.5), "untrained": _decaying(40, -0.3)})
    assert learned.claims().set_index("id").loc[ids, "passed"].all()
    # both decay alike (softmax averaging): the trained model's decay alone (0.06, slope -0.9) is no evidence
    alike = _ctx(tmp_path)
    check_claims(alike, cfg, torch.float32, e, {"trained": _decaying(40, -0.9), "untrained": _decaying(40, -0.9)})
    assert not alike.claims().set_index("id").loc[ids, "passed"].any()


def test_fig3_decay_claims_fail_for_a_model_trained_one_step(tmp_path):
    claims = run_claims("dw_convergence", tmp_path / "run", "train.steps=1", "train.eval_every=1")
    assert not claims.loc[["dherin.fig3.increments_decay", "dherin.fig3.increments_power_law"], "passed"].any()
    assert claims.loc["dherin.sec3.prefix_patch_equals_context", "passed"]  # the exactness claims still hold


def test_fig6_decay_claims_are_judged_against_untrained_models(tmp_path):
    from experiments.dherin.rnn_context.run import check_claims

    cfg = OmegaConf.create({"dynamics": {"tail_fraction": 0.1}})
    final = {k: torch.zeros(4) for k in ("context", "patched")} | {"no_context": torch.ones(4)}
    flat, fast, slow = np.ones((3, 40)), _decaying(40, -1.5)[None], _decaying(40, -0.3)[None]
    ids = ["dherin.fig6.rnn_increments_do_not_decay", "dherin.fig6.attention_increments_decay"]

    def claims(curves):
        ctx = _ctx(tmp_path)
        ctx.log("val_loss_context", 1.0, step=0)
        ctx.log("val_loss_patched", 1.0, step=0)
        check_claims(ctx, cfg, torch.float32, final, 1.0, curves, "trained here", 0.01)
        return ctx.claims().set_index("id").loc[ids, "passed"]

    # learned: attention decays much faster than at init, the RNN stays flat
    assert claims({("rnn", "trained"): flat, ("attention", "trained"): fast,
                   ("rnn", "untrained"): flat, ("attention", "untrained"): slow}).all()
    # the contrast is the architecture's: the same curves trained and untrained
    assert not claims({("rnn", "trained"): flat, ("attention", "trained"): slow,
                       ("rnn", "untrained"): flat, ("attention", "untrained"): slow}).any()


def test_fig6_decay_claims_fail_for_models_trained_one_step(tmp_path):
    claims = run_claims("rnn_context", tmp_path / "run", "train.steps=1", "train.eval_every=1",
                        "attention.train.steps=1")
    assert not claims.loc[["dherin.fig6.rnn_increments_do_not_decay",
                           "dherin.fig6.attention_increments_decay"], "passed"].any()
    assert claims.loc["dherin.fig6.patch_equals_context", "passed"]
