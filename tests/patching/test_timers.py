"""Per-token timings in patching/generate.py on CUDA: each timer reads the clock only after
torch.cuda.synchronize, so the with-context step's queued kernels are not counted in the patch timer.
No GPU here: CUDA is reported initialized and `synchronize` is a mock that records when it is called; the
patcher is the real one on tiny-llama, its timed passes wrapped to record when they run (whatever they take)."""

from __future__ import annotations

import functools

import pytest
import torch

from experiments.patching import generate
from experiments.patching.patcher import Patcher

TIMED = ("context_step", "patched_pass", "control_pass")


@pytest.fixture(scope="module")
def tiny():
    from experiments.patching.load import load_checked
    from experiments.zoo.prompts import encode_prompt

    bundle = load_checked("tiny-llama", torch.float32, "cpu", seed=0)
    return bundle.model, encode_prompt(bundle, "A short prompt about snow.")


def _recording_patcher(model, events: list[str]) -> Patcher:
    """The real patcher; each timed pass appends its name to `events` once it has run."""
    patcher = Patcher(model, "naive")
    for name in TIMED:
        def recorded(*args, _name=name, _pass=getattr(patcher, name), **kwargs):
            out = _pass(*args, **kwargs)
            events.append(_name)
            return out
        setattr(patcher, name, functools.wraps(getattr(patcher, name))(recorded))
    return patcher


def _mock_cuda(monkeypatch, events: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))


def _each_pass_is_synchronized_before_its_timer_stops(events: list[str], passes: list[str]) -> None:
    for i, event in enumerate(events):
        if event in passes:
            assert events[i - 1] == "sync", events  # the timer started after the earlier work finished
            assert events[i + 1] == "sync", events  # and stops after this pass's kernels


@pytest.mark.parametrize(("generation", "passes"), [
    (generate.compare_generation, TIMED),  # with context, patched, control: each timed, each token
    (generate.patched_generate, ("context_step", "patched_pass")),
], ids=["compare_generation", "patched_generate"])
def test_every_timed_pass_is_synchronized_on_cuda(monkeypatch, tiny, generation, passes):
    model, inputs = tiny
    events: list[str] = []
    _mock_cuda(monkeypatch, events)
    assert len(list(generation(_recording_patcher(model, events), inputs, max_new_tokens=3))) == 3
    assert [e for e in events if e != "sync"] == list(passes) * 3
    _each_pass_is_synchronized_before_its_timer_stops(events, list(TIMED))


def test_no_synchronize_when_cuda_was_never_used(monkeypatch, tiny):
    """A CPU run must not create a CUDA context (hundreds of MB on a GPU machine) just to time itself."""
    model, inputs = tiny
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    list(generate.compare_generation(_recording_patcher(model, events), inputs, max_new_tokens=1))
    assert events == list(TIMED)
