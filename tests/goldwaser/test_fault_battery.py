"""A fault battery that breaks the pipeline, not the tables: each fault is put in through the code path a real
bug would take (the rank-1 update every ΔW of Table 1's matrix rules is written by, the with-context pass, the
closed loop's layer forward, the fixed patch's write), the experiments run end to end on tiny-llama at
preset=smoke, and their claims are read back. Every fault must fail at least one claim of the runs it
breaks, and every evidence claim that holds on the honest run must fail on at least one fault
(docs/goldwaser.md, "What the claims catch", is this table).

The faults wrap the lowest-level functions (`rounded.add_rank1_by_rows`, `Patcher.prefill` and
`Patcher.context_step`, `closed_loop.patched_layer_forward`, `fixed_patch._write`), wherever a module holds them
under their own name, so they break whichever code calls them."""

from __future__ import annotations

import dataclasses
import sys

import pandas as pd
import pytest
import torch

from experiments.core.report.text import is_construction
from tests.helpers.in_process import run_claims

PROMPT = "Write a haiku about snow."
# the runs, each an experiment and its overrides (smoke preset, tiny-llama: Table 1's matrix rule, Thm 9)
RUNS = {
    "patch_match_float64": ("patch_match", "model=tiny-llama", "dtype=float64", "variant=naive",
                            "max_new_tokens=3", "prompts=[Hi there.]"),
    "patch_match_float32": ("patch_match", "model=tiny-llama", "dtype=float32", "variant=naive",
                            "max_new_tokens=3", "prompts=[Hi there.]"),
    "layer_errors": ("layer_errors", "model=tiny-llama", "variants=[naive]", "max_new_tokens=2",
                     "prompts=[Hi there.]"),
    "patch_export_float64": ("patch_export", "model=tiny-llama", "dtype=float64", "variant=naive", f"prompt={PROMPT}"),
    # GPT-2: the query alone sits at position 0, the record's input at position n, so a layer fed the record's
    # input instead of its own is seen (on tiny-llama the two agree to rounding wherever a patch is exact). Only
    # a closed loop can be fed it: the open loop's patched pass is the model's own forward, with no layer input
    # to replace
    "gpt2_closed_loop_float64": ("patch_match", "model=tiny-gpt2", "dtype=float64", "variant=closed_loop",
                                 "max_new_tokens=2", "prompts=[Hi there.]"),
    "context_compile_float64": ("context_compile", "model=tiny-llama", "dtype=float64", "per_token=false"),
}
OPEN_LOOP = ("patch_match_float64", "patch_match_float32", "layer_errors", "patch_export_float64")
FLOAT64 = ("patch_match_float64", "layer_errors", "patch_export_float64")
# which runs a fault can reach: a closed loop's replay needs interception, the fixed patch is context_compile's
FAULTS = {
    "negated": OPEN_LOOP,
    "scaled_1e-3": OPEN_LOOP,
    "direction_unnormalised": ("layer_errors",),  # Lemma 6's s = z instead of z / ‖z‖²
    "float32_step": FLOAT64,
    "other_context_targets": ("patch_match_float64", "layer_errors", "patch_export_float64"),
    "replayed_input": ("gpt2_closed_loop_float64",),
    "prefilled_other_prompt": ("patch_match_float64", "patch_match_float32", "patch_export_float64"),
    "fixed_patch_zeroed": ("context_compile_float64",),
    "reload_unpatched": ("patch_export_float64", "context_compile_float64"),  # the checkpoint saved unpatched
}


def _replace_everywhere(monkeypatch, module, name: str, new) -> None:
    """Put `new` wherever a loaded module holds `module.name` itself (a `from ... import name` included)."""
    original = getattr(module, name)
    for mod in list(sys.modules.values()):
        if mod is not None and mod.__name__.startswith("experiments.") and getattr(mod, name, None) is original:
            monkeypatch.setattr(mod, name, new)


def _rank1(monkeypatch, change) -> None:
    """Every ΔW = c vᵀ the matrix rules write goes through `add_rank1_by_rows`: change (c, v, cdt) there."""
    from experiments.patching import rounded

    original = rounded.add_rank1_by_rows

    def broken(W, coef, vec, out, cdt):
        return original(W, *change(coef, vec, cdt), out, cdt)

    _replace_everywhere(monkeypatch, rounded, "add_rank1_by_rows", broken)


def _scaled_coef(coef, factor: float):
    if callable(coef):
        return lambda w, rows: factor * coef(w, rows)
    return factor * coef


def _other_ids(ids: torch.Tensor) -> torch.Tensor:
    """Another context of the same length: every token moved to another one of the vocabulary."""
    return (ids * 7 + 13) % 250 + 3


def _other_inputs(inputs: dict) -> dict:
    return {k: _other_ids(v) if k == "input_ids" else v for k, v in inputs.items()}


def inject(monkeypatch, fault: str) -> None:
    from experiments.patching import closed_loop, fixed_patch
    from experiments.patching.patcher import Patcher

    if fault == "negated":
        _rank1(monkeypatch, lambda c, v, cdt: (_scaled_coef(c, -1.0), v))
    elif fault == "scaled_1e-3":
        _rank1(monkeypatch, lambda c, v, cdt: (_scaled_coef(c, 1.0 + 1e-3), v))
    elif fault == "float32_step":  # the update's direction rounded to float32 inside a float64 run
        _rank1(monkeypatch, lambda c, v, cdt: (c, v.float().to(v.dtype) if cdt == torch.float64 else v))
    elif fault == "other_context_targets":  # the solver's targets from another context, the same query
        prefill, step = Patcher.prefill, Patcher.context_step

        def prefill_both(self, inputs):
            self._fault_other = prefill(self, _other_inputs(inputs))
            return prefill(self, inputs)

        def step_other_targets(self, inputs, cache, *args, **kwargs):
            honest = step(self, inputs, cache, *args, **kwargs)
            other = step(self, inputs, self._fault_other, *args, **kwargs)
            self._fault_other = other.cache
            return dataclasses.replace(honest, targets=other.targets)

        monkeypatch.setattr(Patcher, "prefill", prefill_both)
        monkeypatch.setattr(Patcher, "context_step", step_other_targets)
    elif fault == "prefilled_other_prompt":
        prefill = Patcher.prefill
        monkeypatch.setattr(Patcher, "prefill", lambda self, inputs: prefill(self, _other_inputs(inputs)))
    elif fault == "replayed_input":  # teacher forcing: the recorded with-context input instead of the pass's own
        forward = closed_loop.patched_layer_forward
        monkeypatch.setattr(closed_loop, "patched_layer_forward",
                            lambda adapter, layer, cap, args, kwargs, *rest, **kw:
                            forward(adapter, layer, cap, *_forced(cap, args, kwargs), *rest, **kw))
    elif fault == "direction_unnormalised":
        from experiments.patching import lemmas

        monkeypatch.setattr(lemmas, "input_direction", lambda z: z.clone())
    elif fault == "reload_unpatched":
        from experiments.zoo import float64
        from experiments.zoo.loading import load_model

        reload = float64.reload_float64

        def unpatched(folder, dtype, **kwargs):
            model = reload(folder, dtype, **kwargs)
            model.load_state_dict(load_model("tiny-llama", dtype).model.state_dict())
            return model

        monkeypatch.setattr(float64, "reload_float64", unpatched)
    elif fault == "fixed_patch_zeroed":
        monkeypatch.setattr(fixed_patch, "_write", lambda P, delta: None)
    else:
        raise AssertionError(fault)


def _forced(cap, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The layer's arguments with its hidden state replaced by the record's input at the query."""
    hidden = args[0] if args else kwargs["hidden_states"]
    forced = cap.x_in.to(hidden.dtype).reshape(hidden.shape)
    return ((forced, *args[1:]), kwargs) if args else (args, dict(kwargs, hidden_states=forced))


def _run(name: str, folder) -> pd.DataFrame:
    experiment, *overrides = RUNS[name]
    return run_claims(experiment, folder / name, *overrides)


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> dict[str, dict[str, pd.DataFrame]]:
    """{"honest" or a fault: {run: its claims}}, every run once."""
    out = {"honest": {}}
    folder = tmp_path_factory.mktemp("honest")
    for name in RUNS:
        out["honest"][name] = _run(name, folder)
    for fault, runs in FAULTS.items():
        folder = tmp_path_factory.mktemp(fault)
        with pytest.MonkeyPatch.context() as mp:
            inject(mp, fault)
            out[fault] = {name: _run(name, folder) for name in runs}
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
    """The battery's baseline: on tiny-llama every claim holds (else a fault proves nothing); on tiny-gpt2 the open
    loop is not exact (positions), so there only the claims that hold are counted."""
    for run, claims in battery["honest"].items():
        bad = claims[~claims["passed"].astype(bool)]
        assert run.startswith("gpt2_") or bad.empty, (run, bad[["measured", "tolerance"]])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_fails_a_claim(battery, fault):
    caught = failed(battery, fault)
    evidence = {c for c in caught if not is_construction(c.split("/", 1)[1])}
    # the replay can only be put into a closed loop, a construction: what catches it is its stock forward
    assert (caught if fault == "replayed_input" else evidence), fault


def test_every_evidence_claim_fails_on_some_fault(battery):
    """By claim id, over every run of the battery: no evidence claim passes every fault."""
    claims = {c for table in battery["honest"].values() for c in _evidence(table).index}
    caught = {item.split("/", 1)[1] for fault in FAULTS for item in failed(battery, fault)}
    assert claims - caught == set()


def test_the_catch_table(battery, capsys):
    """The table docs/goldwaser.md shows, printed by `pytest -s -k catch_table`."""
    rows = {}
    for fault in FAULTS:
        for item in failed(battery, fault):
            rows.setdefault(item, []).append(fault)
    with capsys.disabled():
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
