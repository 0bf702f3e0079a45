"""The fault battery's runs and faults (test_fault_battery.py judges them), and its runner: each fault is put in
in a fresh process (`python -m tests.goldwaser.faults FAULT OUT RUN...`), so no memo an earlier run filled
(an adapter check's, a model cache) can carry a fault past its claims.

Each fault goes in through the code path a real bug would take: the rank-1 update every ΔW of Table 1's
matrix rules is written by, the vector updates (norm scales, biases), the with-context pass, the open loop's
patched pass (a replay through a pre-hook, logits read from the wrong tensor, the context leaking in through
the cache), the closed loop's layer forward, the fixed patch's write, the reloaded checkpoint."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

PROMPT = "Write a haiku about snow."
# the runs, each an experiment and its overrides (smoke preset, tiny-llama: Table 1's matrix rule, Thm 9)
RUNS = {
    "patch_match_float64": ("patch_match", "model=tiny-llama", "dtype=float64", "variant=naive",
                            "max_new_tokens=3", "prompts=[Hi there.]"),
    "patch_match_float32": ("patch_match", "model=tiny-llama", "dtype=float32", "variant=naive",
                            "max_new_tokens=3", "prompts=[Hi there.]"),
    "layer_errors": ("layer_errors", "model=tiny-llama", "variants=[naive]", "max_new_tokens=2",
                     "prompts=[Hi there.]"),
    "layer_errors_gemma3": ("layer_errors", "model=tiny-gemma3", "variants=[naive,stable,conditioned]",
                            "max_new_tokens=2", "prompts=[Hi there.]"),
    "patch_export_float64": ("patch_export", "model=tiny-llama", "dtype=float64", "variant=naive", f"prompt={PROMPT}"),
    # GPT-2: the query alone sits at position 0, the record's input at position n, so a layer fed the record's
    # input instead of its own is seen (on tiny-llama the two agree to rounding wherever a patch is exact). Only
    # a closed loop can be fed it: the open loop's patched pass is the model's own forward, with no layer input
    # to replace
    "gpt2_closed_loop_float64": ("patch_match", "model=tiny-gpt2", "dtype=float64", "variant=closed_loop",
                                 "max_new_tokens=2", "prompts=[Hi there.]"),
    "context_compile_float64": ("context_compile", "model=tiny-llama", "dtype=float64", "per_token=false"),
    # every open-loop variant a block takes: Llama's matrix rule (Thm 9) takes naive alone (patch_match_float32),
    # Gemma 3's post-MLP norm (Thm 10, a vector update) naive, stable (App. B) and conditioned
    **{f"gemma3_{variant}_float32": ("patch_match", "model=tiny-gemma3", "dtype=float32", f"variant={variant}",
                                     "max_new_tokens=3", "prompts=[Hi there.]")
       for variant in ("naive", "stable", "conditioned")},
}
OPEN_LOOP = ("patch_match_float64", "patch_match_float32", "layer_errors", "patch_export_float64",
             "gemma3_naive_float32", "gemma3_stable_float32", "gemma3_conditioned_float32", "layer_errors_gemma3")
# the open loop's patch_match runs: the witness judges each (patching/witness.py)
PATCHED_PASS = ("patch_match_float64", "patch_match_float32", "gemma3_naive_float32", "gemma3_stable_float32",
                "gemma3_conditioned_float32", "layer_errors", "layer_errors_gemma3")
FLOAT64 = ("patch_match_float64", "layer_errors", "patch_export_float64")
# which runs a fault can reach: a closed loop's replay needs interception, the fixed patch is context_compile's
FAULTS = {
    "negated": OPEN_LOOP,
    "scaled_1e-3": OPEN_LOOP,
    "direction_unnormalised": ("layer_errors",),  # Lemma 6's s = z instead of z / ‖z‖²
    "float32_step": FLOAT64,
    "other_context_targets": ("patch_match_float64", "layer_errors", "patch_export_float64"),
    "replayed_input": ("gpt2_closed_loop_float64",),
    "prefilled_other_prompt": ("patch_match_float64", "patch_match_float32", "patch_export_float64", "layer_errors",
                               "context_compile_float64"),
    "fixed_patch_zeroed": ("context_compile_float64",),
    "reload_unpatched": ("patch_export_float64", "context_compile_float64"),  # the checkpoint saved unpatched
    # the open loop's patched pass itself: a replay, the wrong tensor, the context through the cache
    "replayed_by_prehook": PATCHED_PASS,
    "logits_from_context": PATCHED_PASS,
    "context_through_cache": PATCHED_PASS,
    # the vector updates (Gemma 3's post-MLP norm scale, Thm 10): each Δ scaled by 1 + 1e-3
    "vector_scaled_1e-3": ("gemma3_naive_float32", "gemma3_stable_float32", "gemma3_conditioned_float32",
                           "layer_errors_gemma3"),
    # every patched tensor its original value: no claim may pass a patch that is not there
    "patch_zeroed": OPEN_LOOP,
    # the export's inputs.json names other tokens than the prompt it was patched for
    "export_names_other_prompt": ("patch_export_float64",),
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
        return lambda *block: factor * coef(*block)
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

        def prefill_both(self, inputs, *args, **kwargs):
            self._fault_other = prefill(self, _other_inputs(inputs))
            return prefill(self, inputs, *args, **kwargs)

        def step_other_targets(self, inputs, cache, *args, **kwargs):
            honest = step(self, inputs, cache, *args, **kwargs)
            other = step(self, inputs, self._fault_other, *args, **kwargs)
            self._fault_other = other.cache
            return dataclasses.replace(honest, targets=other.targets)

        monkeypatch.setattr(Patcher, "prefill", prefill_both)
        monkeypatch.setattr(Patcher, "context_step", step_other_targets)
    elif fault == "prefilled_other_prompt":
        prefill = Patcher.prefill
        monkeypatch.setattr(Patcher, "prefill", lambda self, inputs, *args, **kwargs:
                            prefill(self, _other_inputs(inputs), *args, **kwargs))
    elif fault == "replayed_input":  # teacher forcing: the recorded with-context input instead of the pass's own
        forward = closed_loop.patched_layer_forward
        monkeypatch.setattr(closed_loop, "patched_layer_forward",
                            lambda adapter, layer, cap, args, kwargs, *rest, **kw:
                            forward(adapter, layer, cap, *_forced(cap, args, kwargs), *rest, **kw))
    elif fault == "direction_unnormalised":
        from experiments.patching import lemmas

        monkeypatch.setattr(lemmas, "input_direction", lambda z: z.clone())
    elif fault == "reload_unpatched":  # the checkpoint saved (export) or reloaded (context_compile) unpatched
        from contextlib import nullcontext

        from experiments.patching import export
        from experiments.patching.load import load_checked
        from experiments.zoo import float64

        monkeypatch.setattr(export, "patched_weights", lambda model, tensors: nullcontext(model))
        reload = float64.reload_float64

        def unpatched(folder, dtype, **kwargs):
            model = reload(folder, dtype, **kwargs)
            model.load_state_dict(load_checked("tiny-llama", dtype).model.state_dict())
            return model

        monkeypatch.setattr(float64, "reload_float64", unpatched)
    elif fault in _PATCHED_PASS_FAULTS:
        if fault == "context_through_cache":  # keep the cache each with-context step starts from
            context_step = Patcher.context_step

            def stash(self, inputs, cache, *args, **kwargs):
                self._fault_cache = copy.deepcopy(cache)
                return context_step(self, inputs, cache, *args, **kwargs)

            monkeypatch.setattr(Patcher, "context_step", stash)
        open_loop_pass = Patcher.open_loop_pass
        broken = _PATCHED_PASS_FAULTS[fault]
        monkeypatch.setattr(Patcher, "open_loop_pass",
                            lambda self, query, step, keep, variant, *rest: broken(open_loop_pass, self, query, step,
                                                                                    keep, variant, *rest))
    elif fault in ("vector_scaled_1e-3", "patch_zeroed"):
        tensors = Patcher.open_loop_tensors
        zeroed = fault == "patch_zeroed"

        def changed(self, query, step, variant=None):
            out, stats = tensors(self, query, step, variant)
            params = dict(self.model.named_parameters())
            for name, t in out.items():
                if zeroed:  # W + Δ -> W
                    t.copy_(params[name])
                elif t.dim() == 1:  # W + Δ -> W + (1 + 1e-3) Δ, vectors only
                    t.copy_(params[name] + (t - params[name]) * (1.0 + 1e-3))
            return out, stats

        monkeypatch.setattr(Patcher, "open_loop_tensors", changed)
    elif fault == "export_names_other_prompt":
        from experiments.patching import export

        patch_prompt = export.patch_prompt

        def other_record(*args, **kwargs):
            patch = patch_prompt(*args, **kwargs)
            return dataclasses.replace(patch, context_ids=_other_ids(patch.context_ids))

        monkeypatch.setattr(export, "patch_prompt", other_record)
    elif fault == "fixed_patch_zeroed":
        monkeypatch.setattr(fixed_patch, "_write", lambda P, delta: None)
    else:
        raise AssertionError(fault)


def _forced(cap, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The layer's arguments with its hidden state replaced by the record's input at the query."""
    hidden = args[0] if args else kwargs["hidden_states"]
    forced = cap.x_in.to(hidden.dtype).reshape(hidden.shape)
    return ((forced, *args[1:]), kwargs) if args else (args, dict(kwargs, hidden_states=forced))




def _replayed_by_prehook(open_loop_pass, self, query, step, keep, variant, *rest):
    """Teacher forcing without replacing a forward: a pre-hook on each decoder layer feeds it the with-context
    input x_{l-1} recorded at the query, for the patched pass."""
    def feed(index):
        def hook(_m, args, kwargs):
            forced = step.targets[index].x_in
            hidden = args[0] if args else kwargs["hidden_states"]
            forced = forced.to(hidden.dtype).reshape(hidden.shape)
            return ((forced, *args[1:]), kwargs) if args else (args, dict(kwargs, hidden_states=forced))

        return hook

    handles = [layer.register_forward_pre_hook(feed(i), with_kwargs=True) for i, layer in enumerate(self.layers)]
    try:
        return open_loop_pass(self, query, step, keep, variant, *rest)
    finally:
        for h in handles:
            h.remove()


def _logits_from_context(open_loop_pass, self, query, step, keep, variant, *rest):
    """The patched pass runs, but the logits it reports are the with-context step's."""
    result = open_loop_pass(self, query, step, keep, variant, *rest)
    result.logits = step.logits.clone()
    return result


def _context_through_cache(open_loop_pass, self, query, step, keep, variant, *rest):
    """The patches are computed, but the forward that reports on them runs the query on the with-context KV
    cache of the tokens before it, no patch applied."""
    from experiments.patching.capture import record_outputs
    from experiments.patching.patcher import _cache_name

    result = open_loop_pass(self, query, step, keep, variant, *rest)
    cache = copy.deepcopy(self._fault_cache)
    with record_outputs(self.layers) as outputs:
        out = self.model(input_ids=query.view(1, 1), use_cache=True, **{_cache_name(self.model): cache})
    result.logits = out.logits[0, -1].to(self.logit_dtype)
    result.outputs = list(outputs)
    return result


_PATCHED_PASS_FAULTS = {"replayed_by_prehook": _replayed_by_prehook, "logits_from_context": _logits_from_context,
                        "context_through_cache": _context_through_cache}


def main(fault: str, out: str, *runs: str) -> None:
    """Run `runs` with `fault` put in ("honest": none), each run's claims into OUT/RUN.csv. A run the fault
    makes refuse (a value check of the pipeline's own raising) writes no claims and its one-line reason into
    OUT/RUN.refused: nothing it would have claimed passes (the catch table says "refused"). An honest run must
    not refuse."""
    import pandas as pd

    from experiments.core.errors import UserError
    from experiments.patching.load import load_checked
    from tests.helpers.in_process import run_claims

    folder = Path(out)
    # each model's adapter is checked against its stock layers once a process, when it is first loaded
    # (patching/arch/check.py): loaded here before the fault goes in, so that the fault reaches the claims. Put in
    # first, a fault in the rank-1 update or Lemma 6 makes that check refuse the run: a second line of defence,
    # but one that would leave the claims untested
    for name in sorted({o.split("=", 1)[1] for run in runs for o in RUNS[run] if o.startswith("model=")}):
        load_checked(name, torch.float64, "cpu", seed=0)
    with pytest.MonkeyPatch.context() as mp:
        if fault != "honest":
            inject(mp, fault)
        for name in runs:
            experiment, *overrides = RUNS[name]
            try:
                claims = run_claims(experiment, folder / name, *overrides)
            except (UserError, ValueError, RuntimeError) as err:
                if fault == "honest":
                    raise
                (folder / f"{name}.refused").write_text(str(err).splitlines()[0] if str(err) else type(err).__name__)
                claims = pd.DataFrame(columns=["passed"]).rename_axis("id")
            claims.to_csv(folder / f"{name}.csv")


if __name__ == "__main__":
    main(*sys.argv[1:])
