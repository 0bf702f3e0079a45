"""The claim contract: stable ids, an explicit comparison, and a claim that can fail."""

from __future__ import annotations

import math

import pytest

from experiments.core.results import CLAIM_COLUMNS, RunContext


@pytest.fixture
def ctx(tmp_path):
    return RunContext(run_dir=tmp_path, experiment="x", run_id="r")


def test_each_comparison_passes_and_fails(ctx):
    assert ctx.check("p.f.small", "ref", "d", 1e-9, "<=", 1e-6)
    assert not ctx.check("p.f.small", "ref", "d", 1e-3, "<=", 1e-6)
    assert ctx.check("p.f.big", "ref", "d", 0.99, ">=", 0.9)
    assert not ctx.check("p.f.big", "ref", "d", 0.5, ">=", 0.9)
    assert ctx.check("p.f.near", "ref", "d", 3.02, "within", 0.05, paper_value=3.0)
    assert not ctx.check("p.f.near", "ref", "d", 3.2, "within", 0.05, paper_value=3.0)
    assert not ctx.check("p.f.nan", "ref", "d", math.nan, ">=", -1.0)
    frame = ctx.claims()
    assert list(frame.columns) == CLAIM_COLUMNS
    assert frame["passed"].tolist() == [True, False, True, False, True, False, False]
    assert frame["paper_value"].isna().sum() == 5  # empty where the paper gives no number


@pytest.mark.parametrize("bad", [dict(id="NoDots"), dict(comparison="=="), dict(comparison="within")])
def test_malformed_claims_are_rejected(ctx, bad):
    args = dict(id="p.f.x", ref="ref", description="d", measured=1.0, comparison="<=", tolerance=1.0) | bad
    with pytest.raises(ValueError):
        ctx.check(**args)


def test_only_the_id_contract_is_left(ctx):
    """The legacy claim/claim_at_most/claim_at_least/claim_within (no ids) are gone: one way to record a claim."""
    for legacy in ("claim", "claim_at_most", "claim_at_least", "claim_within"):
        assert not hasattr(ctx, legacy), legacy
    assert list(ctx.claims().columns) == CLAIM_COLUMNS  # also with no claim recorded yet


def test_a_claim_says_what_its_number_is(ctx, tmp_path):
    """`measure` is written to claims.csv (its last column) and read back; a claim without one leaves it empty."""
    from experiments.core.results import read_claims

    ctx.check("p.f.ctrl", "ref", "d", 7.0, ">=", 1.0, measure="log10(control L∞ / patched L∞)")
    ctx.check("p.f.bare", "ref", "d", 1e-9, "<=", 1e-6)
    ctx.flush()
    back = read_claims(tmp_path).set_index("id")["measure"]
    assert back["p.f.ctrl"] == "log10(control L∞ / patched L∞)" and back.isna()["p.f.bare"]
