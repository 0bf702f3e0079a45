"""The open loop's alone pass without an exception to stop it (capture.StandIns): the MLP answers by an output
kept from its first call, so its matrices run once per layer and shape, and what the pass reads is what the full
forward reads, bit for bit (the family check's step 4 holds this per block; its control is in
test_per_matrix_inputs.py)."""

from __future__ import annotations

import pytest
import torch

from experiments.patching import capture
from experiments.patching.generate import patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = {"input_ids": torch.tensor([[5, 6, 7, 8]])}


class _RunEveryTime(capture.StandIns):
    """Stand-ins that keep nothing: the MLP runs in every alone pass, as in the full forward."""

    def forward_of(self, module):
        return lambda *args, **kwargs: type(module).forward(module, *args, **kwargs)


def _generate(model, variant: str, stand_ins: capture.StandIns | None = None) -> tuple[list[int], list]:
    patcher = Patcher(model, variant)
    patcher.stand_ins = stand_ins or patcher.stand_ins
    tokens = [int(t.token) for t in patched_generate(patcher, PROMPT, 4)]
    return tokens, [t.clone() for bufs in patcher.layer_bufs for t in bufs.tensors.values()]


@pytest.mark.parametrize(("name", "variant"), [("tiny-llama", "naive"), ("tiny-gemma3", "conditioned"),
                                               ("tiny-mixtral", "naive"), ("tiny-gpt2", "naive")])
def test_stand_ins_give_the_full_passes_tokens_and_patches_bit_for_bit(name, variant):
    model = load_checked(name, torch.float64, "cpu", seed=0).model
    tokens, patched = _generate(model, variant)
    full_tokens, full_patched = _generate(model, variant, _RunEveryTime())
    assert tokens == full_tokens and len(tokens) == 4
    assert len(patched) == len(full_patched) > 0
    assert all(torch.equal(a, b) for a, b in zip(patched, full_patched, strict=True))


def test_the_alone_pass_runs_each_mlp_once_and_runs_to_the_layers_end(monkeypatch):
    """The alone pass runs a layer's MLP the first time only: over 4 tokens, 3 MLP calls fewer than when it runs
    every time (4 alone passes) and nothing else changes. Each alone pass runs its layer to the end (the layer's
    forward returns as many times as it is called: nothing raised part-way)."""
    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model
    layer = model.model.layers[0]
    calls = {"mlp": 0, "layer_in": 0, "layer_out": 0}
    mlp_forward, layer_forward = type(layer.mlp).forward, type(layer).forward

    def counted_mlp(self, *args, **kwargs):
        calls["mlp"] += self is layer.mlp
        return mlp_forward(self, *args, **kwargs)

    def counted_layer(self, *args, **kwargs):
        calls["layer_in"] += self is layer
        out = layer_forward(self, *args, **kwargs)
        calls["layer_out"] += self is layer
        return out

    monkeypatch.setattr(type(layer.mlp), "forward", counted_mlp)
    monkeypatch.setattr(type(layer), "forward", counted_layer)
    counts = []
    for stand_ins in (None, _RunEveryTime()):
        calls.update(mlp=0, layer_in=0, layer_out=0)
        assert len(_generate(model, "naive", stand_ins)[0]) == 4
        assert calls["layer_in"] == calls["layer_out"] >= 3 * 4  # with-context, alone, patched: each token
        counts.append(calls["mlp"])
    assert counts[1] - counts[0] == 4 - 1
