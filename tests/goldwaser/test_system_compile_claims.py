"""system_compile's claims on made-up metrics: each one fails on the broken input it must fail on (a bake that
did nothing, a zeroed ΔW, a behaviour rate whose interval overlaps the control's) and passes a clear win.
The runs that produce such metrics from a real broken compile are in test_system_compile.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.core.intervals import wilson
from experiments.goldwaser.system_compile.claims import check_claims

HELD = 16


class Claims:
    """Stands in for RunContext.check: the verdicts by id."""

    def __init__(self):
        self.passed, self.measured = {}, {}

    def check(self, id, ref, description, measured, comparison, tolerance, **_):
        self.measured[id] = measured
        self.passed[id] = (measured <= tolerance if comparison == "<=" else measured >= tolerance) \
            and not math.isnan(measured)
        return self.passed[id]


def metrics(kl: dict[str, float], passes: dict[str, int]) -> pd.DataFrame:
    rows = []
    for method in ("reference", "control", "analytic", "bake"):
        for q in range(HELD):
            if method != "reference":
                rows.append(dict(method=method, metric="kl", split="heldout", prompt="p", query=q, value=kl[method]))
            rows.append(dict(method=method, metric="behaviour", split="heldout", prompt="p", query=q,
                             value=float(q < passes[method])))
    return pd.DataFrame(rows)


def verdicts(kl, passes) -> Claims:
    cfg = OmegaConf.create(dict(model="m", methods=["analytic", "bake"], kl_ratio=0.9, margin=0.0))
    claims = Claims()
    check_claims(cfg, claims, metrics(kl, passes))
    return claims


GOOD_KL = dict(control=1.0, analytic=0.3, bake=0.1)
GOOD_RATE = dict(reference=15, control=0, analytic=12, bake=14)
ID = "system_compile.heldout."


def test_a_clear_win_passes_every_claim():
    assert all(verdicts(GOOD_KL, GOOD_RATE).passed.values())


def test_a_bake_that_did_nothing_does_not_beat_a_harmful_analytic_patch():
    """Learning rate ~0: the bake's KL is the control's; the analytic patch is worse than the control. The bake's
    KL is a third of the analytic's, and the old claim passed on it."""
    claims = verdicts(dict(control=1.0, analytic=3.0, bake=1.0), GOOD_RATE)
    assert not claims.passed[ID + "bake_kl_below_control"]
    assert not claims.passed[ID + "bake_kl_below_analytic"]
    assert claims.measured[ID + "bake_kl_below_analytic"] == 3.0  # the analytic patch over the control


def test_a_good_bake_does_not_beat_a_zeroed_analytic_patch():
    """ΔW zeroed: the analytic model is the control; "bake beats analytic" says nothing then."""
    claims = verdicts(dict(control=1.0, analytic=1.0, bake=0.1), GOOD_RATE)
    assert claims.passed[ID + "bake_kl_below_control"] and not claims.passed[ID + "analytic_kl_below_control"]
    assert not claims.passed[ID + "bake_kl_below_analytic"]


@pytest.mark.parametrize("method", ["reference", "analytic", "bake"])
def test_a_rate_whose_interval_overlaps_the_controls_fails(method):
    """4 of 16 against 0 of 16: the point is 0.25 above the control (the old 0.1 margin passed it), the 95 %
    intervals overlap ([0.10, 0.50] and [0, 0.19])."""
    claims = verdicts(GOOD_KL, {**GOOD_RATE, method: 4})
    assert not claims.passed[ID + f"{method}_behaviour_above_control"]
    assert claims.passed[ID + ("bake" if method != "bake" else "analytic") + "_behaviour_above_control"]


def test_wilson_interval_matches_the_closed_form():
    lo, hi = wilson(4, 16)
    assert lo == pytest.approx(0.1018, abs=1e-4) and hi == pytest.approx(0.4950, abs=1e-4)
    assert wilson(0, 16)[0] == 0.0 and wilson(16, 16)[1] == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))
