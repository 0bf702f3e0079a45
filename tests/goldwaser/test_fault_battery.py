"""A fault battery that breaks the pipeline, not the tables: the runs and faults are tests/goldwaser/faults.py,
each fault put in through the code path a real bug would take and run in a fresh process; the experiments run
end to end on tiny-llama and tiny-gemma3 at preset=smoke, and their claims are read back. A fault counts as
caught in a run only if one of that run's evidence claims that held on the honest run fails there; every fault
must be caught in every run it reaches (but the closed loop's replay, a construction's); and every evidence
claim that holds on an honest run must fail on at least one fault (docs/goldwaser.md, "What the claims catch",
is this table)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from experiments.core.report.text import is_construction
from tests.goldwaser.faults import FAULTS, RUNS, inject
from tests.helpers.cli import OFFLINE, cli_env
from tests.helpers.in_process import run_claims
from tests.helpers.repo import REPO_ROOT


def _runs(fault: str, runs, folder) -> dict[str, pd.DataFrame]:
    """`runs` with `fault` put in, in a fresh process: {run: its claims} (none where the run refused)."""
    folder.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "tests.goldwaser.faults", fault, str(folder), *runs], cwd=REPO_ROOT,
                         env=cli_env(OFFLINE), capture_output=True, text=True)
    assert res.returncode == 0, (fault, res.stderr[-3000:])
    return {name: pd.read_csv(folder / f"{name}.csv", index_col="id") for name in runs}


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> dict[str, dict[str, pd.DataFrame]]:
    """{"honest" or a fault: {run: its claims}}, every run once, each fault in its own process."""
    root = tmp_path_factory.mktemp("battery")
    out = {"honest": _runs("honest", list(RUNS), root / "honest")}
    for fault, runs in FAULTS.items():
        out[fault] = _runs(fault, runs, root / fault)
    return out


def _evidence(claims: pd.DataFrame) -> pd.DataFrame:
    return claims[[not is_construction(i) for i in claims.index]]


def failed(battery, fault: str) -> set[str]:
    """run/claim ids that held on the honest run and fail (or went missing) under `fault`."""
    out = set()
    for run, claims in battery[fault].items():
        honest = battery["honest"][run]
        for claim in honest.index[honest["passed"].astype(bool)]:
            if claim not in claims.index or not bool(claims.loc[claim, "passed"]):
                out.add(f"{run}/{claim}")
    return out


def test_the_honest_runs_pass_their_evidence_claims(battery):
    """The battery's baseline: on tiny-llama every claim holds (else a fault proves nothing); where the random
    weights make the open loop inexact (tiny-gpt2's positions, tiny-gemma3's naive and stable) only the claims
    that hold are counted, and the witness's own claim holds everywhere."""
    for run, claims in battery["honest"].items():
        bad = claims[~claims["passed"].astype(bool)]
        assert run.startswith("gpt2_") or "gemma3" in run or bad.empty, (run, bad[["measured", "tolerance"]])
        assert not bad.index.str.contains("instrumented_equals_witness").any(), run


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_fails_an_evidence_claim_in_every_run_it_reaches(battery, fault):
    caught = failed(battery, fault)
    if fault == "replayed_input":  # only a closed loop (a construction) can be fed it: its stock forward catches it
        assert caught, fault
        return
    for run in FAULTS[fault]:
        evidence = {c for c in caught if c.startswith(f"{run}/") and not is_construction(c.split("/", 1)[1])}
        assert evidence, (fault, run)


def test_every_evidence_claim_fails_on_some_fault(battery):
    """By claim id, over every run of the battery: no evidence claim that holds on an honest run passes every
    fault (one that fails honestly, on random weights, has nothing to be caught on)."""
    claims = {c for table in battery["honest"].values() for c in _evidence(table).index[
        _evidence(table)["passed"].astype(bool)]}
    caught = {item.split("/", 1)[1] for fault in FAULTS for item in failed(battery, fault)}
    assert claims - caught == set()


def test_the_catch_table(battery, capsys):
    """The tables docs/goldwaser.md shows, printed by `pytest -s -k catch_table`: per fault, in each run it
    reaches, how many of that run's evidence claims it fails (or that the run refused); per claim, its faults."""
    rows = {}
    for fault in FAULTS:
        for item in failed(battery, fault):
            rows.setdefault(item, []).append(fault)
    with capsys.disabled():
        print("| fault | runs it reaches: evidence claims failed |\n|---|---|")
        for fault, runs in FAULTS.items():
            caught = [c.split("/", 1) for c in failed(battery, fault)]
            counts = {run: sum(r == run and not is_construction(c) for r, c in caught) for run in runs}
            cells = [f"{run} {'refused' if battery[fault][run].empty else counts[run]}" for run in runs]
            print(f"| {fault} | {', '.join(cells)} |")
        print()
        for item in sorted(rows):
            print(f"| `{item}` | {', '.join(rows[item])} |")
    assert rows


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["negated", "scaled_1e-3"])
def test_on_trained_weights_the_faults_fail_the_evidence_claims(tmp_path, fault):
    """The trained Qwen2.5-0.5B (Thm 9: the open loop holds there): the honest run passes its evidence claims,
    the same run with the ΔW fault fails one (ΔW × (1 + 1e-3): its rounding claim, 1e-4)."""
    from tests.helpers.bundled import require_bundled

    require_bundled("qwen2.5-0.5b")
    args = ("model=qwen2.5-0.5b", "dtype=float32", "variant=naive", "max_new_tokens=2", "stock_check=none",
            "prompts=[List three reasons why octopuses are considered intelligent animals.]")
    honest = _evidence(run_claims("patch_match", tmp_path / "honest", *args))
    assert honest["passed"].astype(bool).all(), honest[["measured", "tolerance"]]
    with pytest.MonkeyPatch.context() as mp:
        inject(mp, fault)
        broken = _evidence(run_claims("patch_match", tmp_path / fault, *args))
    assert not broken["passed"].astype(bool).all(), broken[["measured", "tolerance"]]
