"""Per-token timings in patching/generate.py on CUDA: each timer reads the clock only after
torch.cuda.synchronize, so the with-context step's queued kernels are not counted in the patch timer.
No GPU here: CUDA is reported initialized and `synchronize` is a mock that records when it is called."""

from __future__ import annotations

import torch

from experiments.patching import generate
from experiments.patching.patcher import ContextStep, PatchedPass, Patcher
from experiments.patching.variants import VARIANTS


class _Patcher:
    """The three passes a generation step times, each recorded in `events`."""

    variant = VARIANTS["naive"]

    def __init__(self, events: list[str]):
        self.events = events

    def prefill(self, inputs):
        return "cache"

    start = Patcher.start  # the real split of a prompt into the prefill and the first query, over this prefill

    def context_step(self, inputs, cache, logits=True):
        self.events.append("context_step")
        return ContextStep(torch.zeros(5), [], [], cache)

    def patched_pass(self, query, step, keep=None, variant=None):
        self.events.append("patched_pass")
        return PatchedPass(logits=torch.zeros(5), hidden_linf=[], hidden_rel=[])

    def control_pass(self, query, record):
        self.events.append("control")
        return PatchedPass(logits=torch.zeros(5), hidden_linf=[], hidden_rel=[])


def _mock_cuda(monkeypatch, events: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))


def _each_pass_is_synchronized_before_its_timer_stops(events: list[str], passes: list[str]) -> None:
    for i, event in enumerate(events):
        if event in passes:
            assert events[i - 1] == "sync", events  # the timer started after the earlier work finished
            assert events[i + 1] == "sync", events  # and stops after this pass's kernels


def test_compare_generation_synchronizes_cuda_around_every_timed_pass(monkeypatch):
    events: list[str] = []
    _mock_cuda(monkeypatch, events)
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    steps = list(generate.compare_generation(_Patcher(events), inputs, max_new_tokens=3))
    assert len(steps) == 3
    _each_pass_is_synchronized_before_its_timer_stops(events, ["context_step", "patched_pass", "control"])
    assert events.count("sync") == 3 * 6


def test_patched_generate_synchronizes_cuda_around_every_timed_pass(monkeypatch):
    events: list[str] = []
    _mock_cuda(monkeypatch, events)
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    tokens = list(generate.patched_generate(_Patcher(events), inputs, max_new_tokens=2))
    assert len(tokens) == 2
    _each_pass_is_synchronized_before_its_timer_stops(events, ["context_step", "patched_pass"])


def test_no_synchronize_when_cuda_was_never_used(monkeypatch):
    """A CPU run must not create a CUDA context (hundreds of MB on a GPU machine) just to time itself."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    list(generate.compare_generation(_Patcher(events), {"input_ids": torch.tensor([[1, 2]])}, max_new_tokens=1))
    assert "sync" not in events
