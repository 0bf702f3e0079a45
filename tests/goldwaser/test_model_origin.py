"""Which model ran, and whether its weights are random, is said on the console; on random weights a
failed goldwaser claim is flagged as describing those weights."""

from __future__ import annotations

import json
import logging

from experiments.core.results import RunContext
from experiments.goldwaser.common import flag_random_weights, weights_origin


def _ctx(tmp_path, passed: bool) -> RunContext:
    ctx = RunContext(run_dir=tmp_path, experiment="gemma_match", run_id="t")
    ctx.check("goldwaser.table1.naive_float32_rounding", "Table 1", "rounding", 0.0 if passed else 1.0, "<=", 1e-4)
    return ctx


def test_weights_origin_tells_random_from_trained():
    assert weights_origin("tiny-gemma3").startswith("random weights")
    assert weights_origin("gemma-3-270m").startswith("trained weights")
    assert weights_origin("google/gemma-3-1b-it") == "weights from the hub"


def test_a_failed_claim_on_random_weights_is_flagged(tmp_path):
    ctx = _ctx(tmp_path, passed=False)
    flag_random_weights(ctx, "tiny-gemma3")
    assert len(ctx.notes) == 1
    assert "goldwaser.table1.naive_float32_rounding" in ctx.notes[0] and "random weights" in ctx.notes[0]
    assert "model=gemma-3-270m" in ctx.notes[0]


def test_no_flag_when_the_claims_pass_or_the_weights_are_trained(tmp_path):
    ctx = _ctx(tmp_path, passed=True)
    flag_random_weights(ctx, "tiny-gemma3")
    assert ctx.notes == []
    ctx = _ctx(tmp_path, passed=False)
    flag_random_weights(ctx, "gemma-3-270m")
    assert ctx.notes == []


def test_a_run_names_its_model_and_ends_with_the_note(tmp_path, caplog):
    from tests.helpers.in_process import run_claims

    with caplog.at_level(logging.INFO):
        claims = run_claims("gemma_match", tmp_path)
    text = caplog.text
    assert "model tiny-gemma3: Gemma 3, 4 layers, d=64, random weights (offline); float32, variant naive" in text
    failed = claims.index[~claims["passed"].astype(bool)].tolist()
    assert failed, "the smoke run's naive rounding claim fails on the tiny random model"
    notes = json.loads((tmp_path / "run.json").read_text())["notes"]
    assert len(notes) == 1 and all(claim in notes[0] for claim in failed)
    assert text.rstrip().endswith(notes[0])  # said last, after the claims and the summary


def test_the_offline_hint_names_preset_cpu():
    from experiments.patching.load import FIX_HINT

    assert "preset=cpu" in FIX_HINT
