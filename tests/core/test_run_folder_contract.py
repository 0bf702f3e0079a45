"""Every registered experiment's run folder at preset=smoke follows the contract of docs/design.md ("The run
folder"): metrics.csv (tidy), claims.csv (ided, judged by its own comparison, no measured number in a
description), run.json (status, provenance), drawn figures as PNG and PDF that re-render from the CSVs alone.

One test, parametrized over the registry, so a new experiment is checked without a line added here;
its run is the session's shared smoke run (tests/helpers/smoke_runs.py), which its own tests read as well.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pandas as pd
import pytest
from omegaconf import OmegaConf

from experiments.core import registry
from experiments.core.results import CLAIM_COLUMNS
from experiments.patching.load import model_label
from tests.helpers.figures import assert_drawn

TIDY = ["experiment", "run_id", "metric", "value"]
# Claim ids are stable and named by their paper (`dherin.fig2.patch_equals_context`); an extension beyond
# its paper names them by the experiment.
NAMED_BY_EXPERIMENT = {"context_compile", "system_compile"}


def _judged(claims: pd.DataFrame) -> pd.Series:
    """What each claim's comparison says of its numbers: `passed` must be this, not typed in."""
    by = claims["comparison"]
    return (((by == "<=") & (claims["measured"] <= claims["tolerance"]))
            | ((by == ">=") & (claims["measured"] >= claims["tolerance"]))
            | ((by == "within") & ((claims["measured"] - claims["paper_value"]).abs() <= claims["tolerance"])))


def _states(description: str, measured: float) -> bool:
    """Whether `description` spells out the measured number (4 digits, as a number of its own; whole
    numbers such as 0 or 1 are left alone, they are as likely a bound or a step)."""
    if float(measured).is_integer():
        return False
    return re.search(rf"(?<![\d.]){re.escape(f'{measured:.4g}')}(?![\d])", description) is not None


@pytest.mark.parametrize("name", registry.experiment_names())
def test_run_folder_follows_the_contract(smoke_runs, name, tmp_path):
    run_dir = smoke_runs(name)
    for file in ("metrics.csv", "claims.csv", "run.json", ".hydra/config.yaml", ".hydra/overrides.yaml"):
        assert (run_dir / file).is_file(), file

    record = json.loads((run_dir / "run.json").read_text())
    assert record["experiment"] == name and record["status"] == "complete" and record["preset"] == "smoke"
    assert record["device"] == "cpu" and record["dtype"] and "seed" in record
    assert record["git"].keys() == {"commit", "dirty"}
    assert record["packages"]["torch"] and record["wall_time_s"] > 0 and record["start"] and record["end"]
    assert "preset=smoke" in record["overrides"]
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    if isinstance(config.get("model"), str):  # a model by name: the report's Model column says which, and its weights
        assert record.get("model") == model_label(config.model), record.get("model")

    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert list(metrics.columns[:4]) == TIDY and len(metrics)
    assert set(metrics["experiment"]) == {name} and metrics["run_id"].nunique() == 1

    claims = pd.read_csv(run_dir / "claims.csv")
    assert list(claims.columns) == CLAIM_COLUMNS
    assert record["claims_total"] == len(claims) > 0 and claims["id"].is_unique
    prefix = name if name in NAMED_BY_EXPERIMENT else registry.paper_package(name)
    assert claims["id"].str.startswith(f"{prefix}.").all(), claims["id"]
    assert claims["measured"].map(math.isfinite).all()
    assert (_judged(claims) == claims["passed"]).all(), claims[_judged(claims) != claims["passed"]]
    for row in claims.itertuples():  # a description says what is checked, never what was measured
        assert not _states(row.description, row.measured), row.id

    # figures: each PNG drawn, with its PDF; `icl-exp plot` draws the same ones from run.json and
    # metrics.csv alone (no checkpoint, no model). An experiment may draw none (patch_export: a checkpoint).
    from experiments.core.figures import render_run

    pngs = sorted(p.name for p in (run_dir / "figures").glob("*.png"))
    for png in pngs:
        assert (run_dir / "figures" / png).with_suffix(".pdf").is_file(), png
        assert_drawn(run_dir / "figures" / png)
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in ("run.json", "metrics.csv", "claims.csv"):
        shutil.copy(run_dir / file, copy / file)
    render_run(copy)
    assert sorted(p.name for p in (copy / "figures").glob("*.png")) == pngs
