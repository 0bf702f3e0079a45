"""The witness (patching/witness.py): a second instance of the model the pipeline cannot reach, sharing its
parameters; and the refusals of a model someone else has hooked."""

from __future__ import annotations

import pytest
import torch

from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher
from experiments.patching.witness import HookFound, Witness, foreign_hooks
from experiments.zoo.prompts import encode_prompt


@pytest.fixture(scope="module")
def llama():
    return load_checked("tiny-llama", torch.float64, "cpu", seed=0)


def _witness(bundle) -> tuple[Patcher, Witness]:
    patcher = Patcher(bundle.model, "naive")
    return patcher, Witness(bundle.model, patcher.adapter.layers, patcher.logit_dtype)


def test_the_witness_is_fresh_modules_over_the_same_tensors(llama):
    _, witness = _witness(llama)
    mine = dict(witness.twin.named_modules())
    for name, module in llama.model.named_modules():
        assert mine[name] is not module  # fresh module objects: no hook on the model's reaches them
    theirs = dict(witness.twin.named_parameters())
    for name, p in llama.model.named_parameters():
        assert theirs[name] is p  # the same tensors: the witness costs activations only
    for (name, b), (_, b2) in zip(llama.model.named_buffers(), witness.twin.named_buffers(), strict=True):
        assert b2 is b, name


def test_its_reference_is_the_models_uncached_forward_and_its_patched_pass_the_instrumented_one(llama):
    """The reference equals an uncached forward of the same sequence (float64: to rounding); the witness's forward
    of the patched tensors equals the instrumented pass bit for bit; and leaves no hook behind."""
    from experiments.patching.generate import compare_generation, reference_for

    patcher, witness = _witness(llama)
    inputs = encode_prompt(llama, "Hi there.")
    steps = list(compare_generation(patcher, inputs, 3, witness=witness))
    ref = reference_for(witness, inputs, steps)
    for st in steps:
        assert st.witness_diff == 0.0
        rel = float((ref.logits[st.step] - st.context).abs().max() / ref.logits[st.step].abs().max())
        assert rel < 1e-12  # the cached with-context step against the uncached forward, float64
        assert len(st.witness.hidden) == len(ref.hidden) == len(patcher.layers)
    assert foreign_hooks(llama.model) == [] and foreign_hooks(witness.twin) == []


def test_a_hook_someone_else_placed_is_refused_naming_it(llama):
    """A notebook's forward hook (or a replay pre-hook) on the model, or torch's global module hook: the witness
    will not be built, or will not run, and says which hook it found."""
    from experiments.patching.generate import compare_generation

    def spy(_m, _args, _out):
        return None

    handle = llama.model.model.layers[1].register_forward_hook(spy)
    try:
        with pytest.raises(HookFound, match=r"model\.layers\.1 forward_hook: .*spy"):
            _witness(llama)
    finally:
        handle.remove()
    patcher, witness = _witness(llama)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
    try:
        with pytest.raises(HookFound, match="torch global forward_pre_hooks"):
            witness.audit()
    finally:
        handle.remove()
    handle = llama.model.model.layers[0].register_forward_pre_hook(lambda m, a: None)  # placed after it was built
    try:
        with pytest.raises(HookFound, match=r"the model has a hook .* model\.layers\.0 forward_pre_hook"):
            next(compare_generation(patcher, encode_prompt(llama, "Hi there."), 1, witness=witness))
    finally:
        handle.remove()


def test_a_model_too_large_for_a_second_set_of_activations_is_one_line(llama, monkeypatch):
    from experiments.patching import witness as module

    _, witness = _witness(llama)
    monkeypatch.setattr(module, "available_bytes", lambda device: 1024)
    from experiments.core.errors import UserError

    with pytest.raises(UserError, match=r"the witness's reference forward of 5000 tokens needs about .* GiB .*"
                                          r"0\.0 GiB are free on cpu"):
        witness.check_memory(5000, 100, torch.device("cpu"))


def _room_for_weights_and(extra_bytes: int) -> int:
    """The memory a fake machine has: tiny-llama's float32 weights (with the loader's headroom) and `extra_bytes`."""
    from experiments.patching.load import offline_config
    from experiments.zoo.loading import MEMORY_HEADROOM, parameter_count

    return int(parameter_count(offline_config("tiny-llama")) * 4 * MEMORY_HEADROOM) + extra_bytes


def test_the_witness_memory_is_refused_before_the_run_folder(monkeypatch, tmp_path):
    """A prompt whose reference forward cannot fit beside the model: one line from the CLI's checks, naming the
    memory, and no run folder; the same machine runs a short prompt (the control)."""
    from experiments.zoo import loading
    from tests.helpers.in_process import refusal

    monkeypatch.setattr(loading, "available_bytes", lambda device: _room_for_weights_and(20 * 2**20))
    long = "a" * 3000  # tiny-llama's byte tokenizer: 3000 tokens, whose attention scores alone take 4 x 36 MB
    text = refusal("patch_match", tmp_path / "run", "model=tiny-llama", f"prompt={long}", "max_new_tokens=2")
    assert "the witness's reference forward of" in text and "GiB of activations beside the model" in text
    from experiments.core.config_schema import typed
    from experiments.goldwaser.patch_match.run import validate
    from tests.helpers.in_process import compose

    validate(typed(compose("patch_match", "model=tiny-llama", "max_new_tokens=2", preset="smoke")))


def test_a_bound_that_does_not_fit_is_settled_by_the_prompts_own_tokens(monkeypatch):
    """The bound from the prompts' bytes is only a bound: where it does not fit, the prompts are encoded as the
    run will encode them, and a run that fits is not refused."""
    from experiments.core.config_schema import typed
    from experiments.goldwaser import common
    from experiments.goldwaser.patch_match.run import validate
    from experiments.zoo import loading
    from tests.helpers.in_process import compose

    monkeypatch.setattr(loading, "available_bytes", lambda device: _room_for_weights_and(20 * 2**20))
    monkeypatch.setattr(common, "TEMPLATE_TOKENS", 10**5)  # a bound far beyond the memory
    loads = []
    load = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a[0]) or load(*a, **k))
    validate(typed(compose("patch_match", "model=tiny-llama", "max_new_tokens=2", preset="smoke")))
    assert loads == ["tiny-llama"]  # settled by the encoded prompts, not by the bound


def test_every_layer_patched_at_once_is_counted_before_the_run_folder(monkeypatch, tmp_path):
    """A materialized update holds a copy of every patched matrix at once (Qwen 1.5B in float64: 9 GB beside
    12 GB, killed for memory before this was counted): a machine with room for the model but not for those
    copies refuses in one line; the same machine runs apply=action, which keeps factors only (the control)."""
    from experiments.core.config_schema import typed
    from experiments.goldwaser.patch_match.run import validate
    from experiments.patching import witness
    from experiments.patching.load import offline_config, patched_parameter_count
    from experiments.zoo import loading
    from tests.helpers.in_process import compose, refusal

    copies = patched_parameter_count(offline_config("tiny-llama")) * 4
    assert copies > 0
    monkeypatch.setattr(loading, "available_bytes", lambda device: _room_for_weights_and(copies // 2))
    monkeypatch.setattr(witness, "reference_bytes", lambda *args: 0)  # the copies alone decide here
    text = refusal("patch_match", tmp_path / "run", "model=tiny-llama", "max_new_tokens=2")
    assert "with every layer's MLP patched at once" in text and "apply=action" in text
    validate(typed(compose("patch_match", "model=tiny-llama", "max_new_tokens=2", "apply=action", preset="smoke")))


def test_the_checks_before_a_run_build_the_meta_model_once(monkeypatch):
    """validate reads one config three times (patchable, its parameters, what a patch writes): one meta model is
    built for it, not three; a second config object gets its own (the control: the count can grow)."""
    import transformers

    from experiments.core.config_schema import typed
    from experiments.goldwaser.patch_match.run import validate
    from experiments.patching.load import offline_config
    from experiments.zoo import loading
    from tests.helpers.in_process import compose

    built = []
    build = transformers.AutoModelForCausalLM.from_config
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: built.append(a[0].model_type) or build(*a, **k))
    validate(typed(compose("patch_match", "model=tiny-llama", "max_new_tokens=2", preset="smoke")))
    assert built == ["llama"]
    loading.parameter_count(offline_config("tiny-llama"))
    assert built == ["llama", "llama"]
