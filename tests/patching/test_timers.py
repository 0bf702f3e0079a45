"""Per-token timings in patching/generate.py on CUDA: compare_generation's timers read the clock only after
torch.cuda.synchronize, so the with-context step's queued kernels are not counted in the patch timer; patched
generation's are CUDA events around each stretch, read (waited for) only when its time is asked.
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


def test_every_timed_pass_is_synchronized_on_cuda(monkeypatch, tiny):
    """compare_generation: with context, patched, control: each timed, each token."""
    model, inputs = tiny
    events: list[str] = []
    _mock_cuda(monkeypatch, events)
    assert len(list(generate.compare_generation(_recording_patcher(model, events), inputs, max_new_tokens=3))) == 3
    assert [e for e in events if e != "sync"] == list(TIMED) * 3
    _each_pass_is_synchronized_before_its_timer_stops(events, list(TIMED))


class _FakeEvent:
    """torch.cuda.Event as patched generation uses it, recording its calls into `log`; 1 ms per recorded event."""

    log: list[str] = []
    made = 0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        _FakeEvent.made += 1
        self.id = _FakeEvent.made

    def record(self):
        self.log.append(f"record {self.id}")

    def synchronize(self):
        self.log.append(f"wait {self.id}")

    def elapsed_time(self, end):
        return float(end.id - self.id)


def test_patched_generation_on_cuda_times_by_events_and_waits_for_none_between_tokens(monkeypatch, tiny):
    """On CUDA each stretch (the with-context step, the patched pass) is two events recorded around it, and
    nothing waits for the card until a token's time is read, then for that stretch's end event alone."""
    model, inputs = tiny
    events: list[str] = []
    _FakeEvent.log = events
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))

    class OnCuda(generate.Span):
        def __init__(self, device):
            super().__init__(torch.device("cuda"))

    monkeypatch.setattr(generate, "Span", OnCuda)
    steps = list(generate.patched_generate(_recording_patcher(model, events), inputs, max_new_tokens=3))
    assert "sync" not in events and not any(e.startswith("wait") for e in events)
    token = [e for e in events if not e.startswith("wait")]
    first = [int(e.split()[1]) for e in token if e.startswith("record")][0]
    ids = iter(range(first, first + 12))
    assert token == [e for _ in range(3) for e in (f"record {next(ids)}", "context_step", f"record {next(ids)}",
                                                   f"record {next(ids)}", "patched_pass", f"record {next(ids)}")]
    events.clear()
    assert [st.ms for st in steps] == [2.0, 2.0, 2.0]  # (end − start) a stretch, two stretches a token
    assert events == [f"wait {first + 4 * k + j}" for k in range(3) for j in (1, 3)]


def test_no_synchronize_when_cuda_was_never_used(monkeypatch, tiny):
    """A CPU run must not create a CUDA context (hundreds of MB on a GPU machine) just to time itself."""
    model, inputs = tiny
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    list(generate.compare_generation(_recording_patcher(model, events), inputs, max_new_tokens=1))
    assert events == list(TIMED)
