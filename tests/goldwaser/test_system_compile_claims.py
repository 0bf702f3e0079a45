"""system_compile's claims on made-up metrics, per system prompt: each one fails on the broken input it must fail
on (a bake that did nothing, a zeroed ΔW, a behaviour rate whose interval overlaps the control's, a leak at KL
0, pooled evidence that no prompt has alone) and passes a clear win; a KL of 0 is a result, not a crash.
The runs that produce such metrics from a real broken compile are in test_system_compile.py."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from experiments.core.intervals import wilson
from experiments.goldwaser.system_compile.claims import check_claims, claim_name, pooled, rounding_kl

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


def metrics(kl: dict[str, float], passes: dict[str, int], prompt: str = "p", floor: float = 1e-9) -> pd.DataFrame:
    rows = []
    for method in ("reference", "control", "analytic", "bake"):
        for q in range(HELD):
            if method != "reference":
                rows.append(dict(method=method, metric="kl", split="heldout", prompt=prompt, query=q,
                                 value=kl[method]))
            else:
                rows.append(dict(method=method, metric="leak_floor", split="heldout", prompt=prompt, query=q,
                                 value=floor))
            rows.append(dict(method=method, metric="behaviour", split="heldout", prompt=prompt, query=q,
                             value=float(q < passes[method])))
    return pd.DataFrame(rows)


def verdicts(kl, passes, frame: pd.DataFrame | None = None) -> Claims:
    cfg = OmegaConf.create(dict(model="m", methods=["analytic", "bake"], kl_ratio=0.9, margin=0.0))
    claims = Claims()
    claims.kinds = check_claims(cfg, claims, metrics(kl, passes) if frame is None else frame)
    return claims


GOOD_KL = dict(control=1.0, analytic=0.3, bake=0.1)
GOOD_RATE = dict(reference=15, control=0, analytic=12, bake=14)
ID = "system_compile.heldout.p."


def test_a_clear_win_passes_every_claim():
    claims = verdicts(GOOD_KL, GOOD_RATE)
    assert all(claims.passed.values()) and len(claims.passed) == 8


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


def many(per_prompt: dict[str, tuple[dict, dict]]) -> pd.DataFrame:
    return pd.concat([metrics(kl, passes, prompt) for prompt, (kl, passes) in per_prompt.items()], ignore_index=True)


def test_six_prompts_at_3_of_16_each_pass_no_behaviour_claim():
    """Pooled as independent replies, 18 of 96 against 0 of 96 parts (lo 0.12 > hi 0.04); per prompt, 3 of 16
    against 0 of 16 never does, and the summary says 0 of 6 prompts."""
    frame = many({f"p{i}": (GOOD_KL, {**GOOD_RATE, "analytic": 3}) for i in range(6)})
    claims = verdicts(None, None, frame)
    analytic = [v for k, v in claims.passed.items() if k.endswith("analytic_behaviour_above_control")]
    assert len(analytic) == 6 and not any(analytic)
    assert wilson(18, 96)[0] > wilson(0, 96)[1]  # what the pooled claim passed on
    summary = {(metric, i.get("claim", i.get("method"))): (v, i) for metric, v, i in pooled(frame, ["analytic", "bake"],
                                                                                            claims.kinds)}
    value, index = summary[("prompts_passed", "analytic_behaviour_above_control")]
    assert (value, index["prompts"]) == (0.0, 6)


def test_one_prompt_at_16_of_16_beside_one_at_0_passes_one_claim_of_two():
    frame = many({"a": (GOOD_KL, {**GOOD_RATE, "analytic": 16}), "b": (GOOD_KL, {**GOOD_RATE, "analytic": 0})})
    claims = verdicts(None, None, frame)
    assert claims.passed["system_compile.heldout.a.analytic_behaviour_above_control"]
    assert not claims.passed["system_compile.heldout.b.analytic_behaviour_above_control"]


def test_a_method_ten_times_worse_on_two_prompts_of_three_fails_there_and_its_geometric_mean_says_so():
    """The ratio of means over prompts was 0.61 here (a pass); per prompt it is 0.42, 10 and 10."""
    frame = many({"a": (dict(control=10.0, analytic=4.2, bake=0.1), GOOD_RATE),
                  "b": (dict(control=0.1, analytic=1.0, bake=0.01), GOOD_RATE),
                  "c": (dict(control=0.1, analytic=1.0, bake=0.01), GOOD_RATE)})
    claims = verdicts(None, None, frame)
    assert (4.2 + 1 + 1) / (10 + 0.1 + 0.1) == pytest.approx(0.61, abs=0.01)
    assert [claims.passed[f"system_compile.heldout.{p}.analytic_kl_below_control"] for p in "abc"] == [True, False,
                                                                                                        False]
    geo = {i["method"]: v for metric, v, i in pooled(frame, ["analytic", "bake"], claims.kinds)
           if metric == "kl_ratio_geomean"}
    assert geo["analytic"] == pytest.approx((0.42 * 10 * 10) ** (1 / 3))
    assert geo["bake"] == pytest.approx(1e-4 ** (1 / 3))


def test_a_kl_of_zero_is_a_result_and_a_leak():
    """A bake that is the stock model reading the prompt: KL 0.000 on every held-out query. It passes the KL
    claim (0 / control) and fails its leak claim; the analytic patch at KL 0 too: no ZeroDivisionError,
    bake / analytic = 0 / 0 fails."""
    claims = verdicts(dict(control=1.0, analytic=0.0, bake=0.0), GOOD_RATE)
    assert claims.passed[ID + "bake_kl_below_control"] and claims.measured[ID + "bake_kl_below_control"] == 0.0
    assert not claims.passed[ID + "bake_no_leak"] and not claims.passed[ID + "analytic_no_leak"]
    assert claims.measured[ID + "bake_no_leak"] == -math.inf
    assert not claims.passed[ID + "bake_kl_below_analytic"]


def test_a_kl_below_rounding_is_a_leak_and_one_above_is_not():
    leaked = verdicts(dict(control=1.0, analytic=0.3, bake=1e-12), GOOD_RATE)
    assert not leaked.passed[ID + "bake_no_leak"] and leaked.passed[ID + "analytic_no_leak"]
    assert leaked.measured[ID + "bake_no_leak"] == pytest.approx(-3.0)


def test_a_control_at_kl_zero_fails_the_ratios_without_a_crash():
    claims = verdicts(dict(control=0.0, analytic=0.3, bake=0.1), GOOD_RATE)
    assert claims.measured[ID + "analytic_kl_below_control"] == math.inf
    assert not claims.passed[ID + "analytic_kl_below_control"] and not claims.passed[ID + "bake_kl_below_analytic"]


def test_a_prompt_name_becomes_a_claim_id_part():
    assert claim_name("Ahoy-2 (loud)") == "ahoy_2_loud" and claim_name("one_sentence") == "one_sentence"


def test_the_leak_floor_is_what_rounding_could_make():
    """½ (1e-4 · max |logit|)² a row for float32: 4.5e-6 for logits up to 30."""
    logits = torch.zeros(2, 5)
    logits[0, 0], logits[1, 3] = 30.0, -10.0
    assert rounding_kl(logits, "float32") == pytest.approx((0.5 * (3e-3) ** 2 + 0.5 * (1e-3) ** 2) / 2)


def test_wilson_interval_matches_the_closed_form():
    lo, hi = wilson(4, 16)
    assert lo == pytest.approx(0.1018, abs=1e-4) and hi == pytest.approx(0.4950, abs=1e-4)
    assert wilson(0, 16)[0] == 0.0 and wilson(16, 16)[1] == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))
