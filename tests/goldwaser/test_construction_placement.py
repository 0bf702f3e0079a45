"""Wherever a closed loop produced a number, its claim is a construction: the closed-loop export
(GPT-2's default), the closed loop's MoE routing claim, a bfloat16 closed loop. Every report (report.md,
report.html, the docs' results page) shows them after the construction note, none above it."""

from __future__ import annotations

import pytest

from experiments.core.report.collect import build_report
from experiments.core.report.markdown import render_markdown
from experiments.core.report.page import render_html
from experiments.core.report.results_page import render_results_page
from experiments.core.report.text import CONSTRUCTION_NOTE, is_construction
from tests.helpers.in_process import run_claims

PROMPT = "prompt=Write a haiku about snow."
RECORD = "goldwaser.record."  # the with-context pass against an uncached forward: the same in every variant


@pytest.fixture(scope="module")
def closed_loop_runs(tmp_path_factory):
    """Three runs whose numbers a closed loop produced, in one results folder."""
    root = tmp_path_factory.mktemp("results")
    claims = {
        "export": run_claims("patch_export", root / "patch_export" / "a", "model=tiny-gpt2", PROMPT),
        "moe": run_claims("patch_match", root / "patch_match" / "a", "model=tiny-mixtral", "variant=closed_loop"),
        "bf16": run_claims("patch_match", root / "gemma_match" / "a", "model=tiny-llama", "variant=closed_loop",
                           "dtype=bfloat16"),
    }
    return root, claims


def test_every_claim_a_closed_loop_makes_is_a_construction_with_a_control_that_can_fail(closed_loop_runs):
    _, claims = closed_loop_runs
    for name, table in claims.items():  # but the with-context side's own check, which no variant touches
        assert all(is_construction(i) or i.startswith(RECORD) for i in table.index), (name, list(table.index))
    assert "goldwaser.construction.moe_same_experts_closed_loop" in claims["moe"].index
    assert {"goldwaser.construction.export.every_layer", "goldwaser.construction.export.every_layer_control",
            "goldwaser.construction.export.last_layer_control_logits"} <= set(claims["export"].index)
    bf16 = claims["bf16"]
    assert bf16.loc["goldwaser.construction.closed_loop_bfloat16_every_layer", "passed"]
    assert bf16.loc["goldwaser.construction.closed_loop_bfloat16_every_layer_control", "passed"]


def test_no_construction_above_the_note_in_any_report(closed_loop_runs):
    root, claims = closed_loop_runs
    report = build_report(root)
    for page in (render_markdown(report), render_html(report), render_results_page(report, "icl-exp report")):
        note = page.index(CONSTRUCTION_NOTE.split(":")[0] + ":")
        for table in claims.values():
            for claim in table.index:
                if claim in page and not claim.startswith(RECORD):
                    assert page.index(claim) > note, claim
