"""The with-context and the patched pass layer by layer (patching/interleave.py): the same bits as one
after the other, really in turns, and a failure on either side ends both with one error and no thread
left behind."""

from __future__ import annotations

import copy
import functools
import threading

import pytest
import torch

from experiments.patching.generate import _prefill_context
from experiments.patching.interleave import LayerRelay, interleaved_step
from experiments.patching.patcher import Patcher
from experiments.zoo.loading import TINY_ARCHITECTURES, load_model
from experiments.zoo.prompts import encode_prompt

PROMPT = "Write a haiku about the first snow of winter."


@functools.cache
def _bundle(name: str, dtype: torch.dtype = torch.float32):
    return load_model(name, dtype, "cpu", seed=0)


def _start(name: str, variant: str = "closed_loop", dtype: torch.dtype = torch.float32):
    b = _bundle(name, dtype)
    patcher = Patcher(b.model, variant)
    cache, query = _prefill_context(patcher, encode_prompt(b, PROMPT))
    return patcher, cache, query


def _sequential(patcher, query, cache):
    _, caps, cache = patcher.context_step({"input_ids": query}, cache, logits=False)
    return patcher.patched_pass(query, caps), cache


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("variant", ["closed_loop", "naive"])
@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_interleaved_steps_are_the_sequential_bits(name, variant):
    """Three tokens, each fed back: logits, per-layer errors and the with-context cache bit for bit."""
    patcher, cache, query = _start(name, variant)
    seq_cache, int_cache = copy.deepcopy(cache), copy.deepcopy(cache)
    assert patcher.interleaves
    for _ in range(3):
        seq, seq_cache = _sequential(patcher, query, seq_cache)
        got, int_cache = interleaved_step(patcher, query, int_cache)
        assert torch.equal(seq.logits, got.logits)
        assert seq.hidden_linf == got.hidden_linf
        assert all(torch.equal(a, b) for a, b in zip(_cache_tensors(seq_cache), _cache_tensors(int_cache), strict=True))
        query = seq.logits.argmax().view(1, 1)
    # control: the next token alone without the context gives other logits (the test would see a swap)
    assert not torch.equal(patcher.control_logits(query), got.logits)


def test_the_passes_take_turns_layer_by_layer(monkeypatch):
    """Context layer l is recorded before patched layer l runs, and patched layer l is done before context
    layer l + 1: one after the other would give all context layers first."""
    events: list[tuple[str, int]] = []
    done, await_ = LayerRelay.context_layer_done, LayerRelay.await_context_layer

    def context_layer_done(self, index):
        events.append(("context", index))
        done(self, index)

    def await_context_layer(self, index):
        await_(self, index)
        events.append(("patched", index))

    monkeypatch.setattr(LayerRelay, "context_layer_done", context_layer_done)
    monkeypatch.setattr(LayerRelay, "await_context_layer", await_context_layer)
    patcher, cache, query = _start("tiny-llama")
    interleaved_step(patcher, query, cache)
    n = len(patcher.layers)
    assert events == [(side, i) for i in range(n) for side in ("context", "patched")]


def _threads_after(before: int) -> int:
    for _ in range(100):  # a daemon thread that was joined is gone at once; allow the interpreter a moment
        if threading.active_count() <= before:
            break
        threading.Event().wait(0.01)
    return threading.active_count()


def test_a_failing_with_context_layer_ends_both_passes_with_its_error(monkeypatch):
    patcher, cache, query = _start("tiny-llama")
    layer = patcher.layers[1]
    own = type(layer).forward

    def forward(self, *args, **kwargs):  # layer 1 fails on the with-context thread only
        if self is layer and threading.current_thread().name == "with-context pass":
            raise ValueError("layer 1 broke")
        return own(self, *args, **kwargs)

    monkeypatch.setattr(type(layer), "forward", forward)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="with-context pass failed at or before layer 1: ValueError: layer 1 broke"):
        interleaved_step(patcher, query, cache)
    assert _threads_after(before) == before


def test_a_failing_patched_layer_stops_the_with_context_pass(monkeypatch):
    patcher, cache, query = _start("tiny-llama")
    calls = {"n": 0}
    run = Patcher._patch_and_run

    def fail_at_layer_1(self, index, *args):
        calls["n"] += 1
        if index == 1:
            raise RuntimeError("patch broke at layer 1")
        return run(self, index, *args)

    monkeypatch.setattr(Patcher, "_patch_and_run", fail_at_layer_1)
    reached: list[int] = []
    done = LayerRelay.context_layer_done

    def context_layer_done(self, index):
        reached.append(index)
        done(self, index)

    monkeypatch.setattr(LayerRelay, "context_layer_done", context_layer_done)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="patch broke at layer 1"):
        interleaved_step(patcher, query, cache)
    assert _threads_after(before) == before
    assert reached == [0, 1]  # the with-context pass stopped where the patched pass did: no layer 2
    assert calls["n"] == 2

