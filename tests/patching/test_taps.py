"""Hooks placed once (taps.py): an attached hook means what torch's own would, the torch hooks come off when the last
attachment does (outside a session), and a patched generation places none after its first token."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from experiments.patching import taps
from experiments.patching.generate import patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher


def _hooks(module: nn.Module) -> int:
    return len(module._forward_pre_hooks) + len(module._forward_hooks)


def test_an_attached_hook_means_what_torchs_own_would():
    """Pre-hooks replace the input (args, or (args, kwargs)), forward hooks the output, each in the order attached,
    on the same module as torch's own registration gives."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)

    def with_torch(layer):
        handles = [layer.register_forward_pre_hook(lambda m, a: (a[0] * 2,)),
                   layer.register_forward_pre_hook(lambda m, a, kw: ((a[0] + 1,), kw), with_kwargs=True),
                   layer.register_forward_hook(lambda m, a, out: out - a[0].sum()),
                   layer.register_forward_hook(lambda m, a, kw, out: out * 3, with_kwargs=True),
                   layer.register_forward_hook(lambda m, a, out: None)]  # reads only
        try:
            return layer(x)
        finally:
            for h in handles:
                h.remove()

    def with_taps(layer):
        attached = [taps.attach_pre(layer, lambda m, a: a[0] * 2),  # a bare tensor, as torch allows
                    taps.attach_pre(layer, lambda m, a, kw: ((a[0] + 1,), kw), with_kwargs=True),
                    taps.attach_post(layer, lambda m, a, out: out - a[0].sum()),
                    taps.attach_post(layer, lambda m, a, kw, out: out * 3, with_kwargs=True),
                    taps.attach_post(layer, lambda m, a, out: None)]
        try:
            return layer(x)
        finally:
            for a in attached:
                a.remove()

    layer = nn.Linear(4, 4)
    expected = with_torch(layer)
    assert torch.equal(with_taps(layer), expected)
    assert not torch.equal(layer(x), expected)  # the hooks did something
    assert _hooks(layer) == 0 and "forward" not in vars(layer)  # and left nothing behind


def test_outside_a_session_the_last_removal_lifts_the_torch_hooks():
    layer = nn.Linear(2, 2)
    first = taps.attach_post(layer, lambda m, a, out: None)
    second = taps.attach_pre(layer, lambda m, a: None)
    assert _hooks(layer) == 2  # one pair, however many are attached
    first.remove()
    assert _hooks(layer) == 2
    second.remove()
    assert _hooks(layer) == 0 and taps._ATTR not in vars(layer)


def test_a_session_keeps_what_it_placed_on_its_model_until_it_ends():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    layer, other, elsewhere = model[0], model[1], nn.Linear(2, 2)
    with taps.session(model):
        before = RemovableHandle.next_id
        for _ in range(3):
            taps.attach_post(layer, lambda m, a, out: None).remove()
        assert RemovableHandle.next_id == before + 2  # placed once, the first time
        assert _hooks(layer) == 2
        with taps.session(model):  # an inner session on the same model hands what it placed to the outer one
            taps.attach_pre(other, lambda m, a: None).remove()
        assert _hooks(other) == 2
        taps.attach_pre(elsewhere, lambda m, a: None).remove()  # another model's: not kept
        assert _hooks(elsewhere) == 0
    assert _hooks(layer) == 0 and _hooks(other) == 0


def test_a_replaced_forward_runs_in_place_of_the_modules_own_and_goes_again():
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    own = layer(x)
    replaced = taps.replace_forward(layer, lambda z: z * 7)
    assert torch.equal(layer(x), x * 7)
    replaced.remove()
    assert torch.equal(layer(x), own) and "forward" not in vars(layer) and _hooks(layer) == 0


@pytest.mark.parametrize("variant", ["naive", "closed_loop"])
def test_patched_generation_places_no_hook_after_its_first_token_and_leaves_none(variant):
    """After the first token no torch hook is registered (RemovableHandle's counter stays), where before this every
    token registered a few per layer; at the end the model has no hook and no replaced forward."""
    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model
    forwards = [m for m in model.modules() if "forward" in vars(m)]  # the loader's own (float64 rotary tables)
    counts = []
    for _ in patched_generate(Patcher(model, variant), {"input_ids": torch.tensor([[5, 6, 7, 8]])}, 4):
        counts.append(RemovableHandle.next_id)
    assert len(counts) == 4 and counts[1:] == [counts[0]] * 3
    assert not any(_hooks(m) for m in model.modules())
    assert [m for m in model.modules() if "forward" in vars(m)] == forwards
