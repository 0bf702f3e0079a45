"""patch_match's routing claim (Table 1, Thm 11: the patched router picks the context pass's experts) runs for
every block whose output rule moves routed experts (`rule.routed_experts`), whatever the family is called:
Mixtral, which has an adapter file, and Qwen3-MoE, read from its module tree, alike. It once ran only where
the family's name was "Mixtral"."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from experiments.core.results import RunContext
from experiments.goldwaser.patch_match.claims import check_claims
from tests.helpers.in_process import run_claims

CLAIM = "goldwaser.table1.moe_same_experts_naive"


def _claims(tmp_path, routing: list[float] | None, routed: bool) -> pd.DataFrame:
    rows = []
    for step in range(2):
        idx = dict(experiment="patch_match", run_id="r", prompt=0, step=step, model="m", family="Any MoE",
                   dtype="float32", variant="naive")
        rows += [dict(idx, metric="top1_match", value=1.0), dict(idx, metric="logit_linf", value=1e-6),
                 dict(idx, metric="logit_linf_rel", value=1e-7), dict(idx, metric="control_logit_linf", value=5.0)]
        if routing is not None:
            rows.append(dict(idx, metric="routing_changed", value=routing[step]))
    ctx = RunContext(run_dir=tmp_path, experiment="patch_match", run_id="r", device=torch.device("cpu"))
    check_claims(ctx, pd.DataFrame(rows), torch.float32, "naive", True, "m", routed=routed)
    return ctx.claims().set_index("id")


def test_the_claim_follows_the_rule_not_the_family_name(tmp_path):
    assert _claims(tmp_path, [0.0, 0.0], routed=True).loc[CLAIM, "passed"]
    assert CLAIM not in _claims(tmp_path, [0.0, 0.0], routed=False).index  # a dense block: no routing to check


def test_the_claim_can_fail(tmp_path):
    """The controls: other experts fired once, and an MoE run that measured no routing at all."""
    assert not _claims(tmp_path, [0.0, 1.0], routed=True).loc[CLAIM, "passed"]
    unmeasured = _claims(tmp_path, None, routed=True).loc[CLAIM]
    assert math.isnan(unmeasured["measured"]) and not unmeasured["passed"]


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """Qwen3-MoE's tiny model saved as a checkpoint folder: a family with no adapter file (arch/tiny.py)."""
    from experiments.patching.arch.tiny import save_checkpoint

    return save_checkpoint("qwen3_moe", tmp_path_factory.mktemp("ckpt") / "qwen3_moe")


@pytest.mark.parametrize("model", ["tiny-mixtral", "qwen3_moe"])
def test_every_moe_family_gets_the_routing_claim(tmp_path, model, request):
    name = str(request.getfixturevalue("qwen3_moe")) if model == "qwen3_moe" else model
    claims = run_claims("patch_match", tmp_path / "run", f"model={name}", "variant=naive", "control=false")
    assert CLAIM in claims.index, list(claims.index)
    assert claims.loc[CLAIM, "passed"]
