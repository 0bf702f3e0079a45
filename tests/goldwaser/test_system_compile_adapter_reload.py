"""format=peft loads its adapter back onto the base weights in the run's own process (adapter_reload.py): the
model must come back exactly as it was, module for module and weight for weight, when the load succeeds and
when it fails midway (peft puts its LoRA layers in before it reads the adapter's weights), and the run must
then end on the load's own error, not on a KeyError from restoring a model that still holds peft's layers."""

from __future__ import annotations

import pytest
import torch

from experiments.goldwaser.system_compile.adapter import ADAPTER_WEIGHTS, lora_factors, write_adapter
from experiments.goldwaser.system_compile.adapter_reload import base_weights, lora_loaded

CHANGED = ("model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.up_proj.weight")


@pytest.fixture
def compiled(tmp_path):
    """tiny-llama with two matrices changed (as a compile leaves it), their originals, and its adapter's folder."""
    from experiments.patching.load import load_checked

    model = load_checked("tiny-llama", torch.float32).model
    params = dict(model.named_parameters())
    originals = {n: params[n].detach().clone() for n in CHANGED}
    with torch.no_grad():
        for n in CHANGED:
            params[n].add_(0.01 * torch.randn_like(params[n]))
    write_adapter(tmp_path, lora_factors(model, originals, 2), 2, "unused", torch.float32)
    return model, originals, tmp_path


def state(model) -> tuple[list, dict]:
    """Every module's name and class, every parameter's value: what 'as it was' means."""
    return ([(n, type(m)) for n, m in model.named_modules()],
            {n: p.detach().clone() for n, p in model.named_parameters()})


def assert_as_before(model, before) -> None:
    modules, params = state(model)
    assert modules == before[0]  # no LoRA layer left, no name changed
    assert params.keys() == before[1].keys() and all(torch.equal(params[n], before[1][n]) for n in params)
    assert not hasattr(model, "peft_config")


def test_a_load_that_fails_midway_gives_the_model_back_as_it_was(compiled):
    from safetensors.torch import load_file, save_file

    model, originals, folder = compiled
    tensors = load_file(folder / ADAPTER_WEIGHTS)
    first_a = next(k for k in sorted(tensors) if k.endswith("lora_A.weight"))
    tensors[first_a] = torch.zeros(2, 3)  # a factor of the wrong shape: read only once peft's layers are in
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    before = state(model)
    with pytest.raises(RuntimeError, match="size mismatch"):
        with base_weights(model, originals), lora_loaded(model, folder):
            pytest.fail("the corrupted adapter loaded")
    assert_as_before(model, before)


def test_a_load_that_succeeds_gives_the_model_back_too_and_computes_the_compiled_model(compiled):
    model, originals, folder = compiled
    before = state(model)
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        want = model(ids).logits
        with base_weights(model, originals), lora_loaded(model, folder) as peft_model:
            assert any("lora_A" in n for n, _ in model.named_parameters())  # the adapter is in for the block
            got = peft_model(ids).logits
    assert_as_before(model, before)
    # rank 2 of a full-rank random ΔW: close to the compiled model, not equal (the run's claims measure it)
    assert (got - want).abs().max() < 0.5 * want.abs().max()


def test_a_run_whose_reload_fails_ends_on_that_error_with_the_model_restored(tmp_path, monkeypatch):
    """In the real run: peft fails after wrapping; the run fails on peft's error, and the compile's own
    restore (study.run_prompt's finally), which reads the stock names, does not raise over it."""
    from peft import PeftModel

    from tests.helpers.in_process import run_claims

    def broken(self, *_a, **_k):
        raise RuntimeError("the adapter's weights cannot be read")

    monkeypatch.setattr(PeftModel, "load_adapter", broken)
    with pytest.raises(RuntimeError, match="the adapter's weights cannot be read"):
        run_claims("system_compile", tmp_path / "run", "methods=[bake]", "save=bake", "format=peft")
