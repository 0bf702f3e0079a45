"""The open loop batched across layers (issue 54, `batch_layers`): every layer's input matrices patched by one call
over stacked weights gives the bits of the per-layer path, logits, per-layer errors and patched tensors; the
stacking moves the model's parameters without changing a bit of its forward; and the bad inputs are refused in
one line."""

from __future__ import annotations

import pytest
import torch

from experiments.patching import layer_stack
from experiments.patching.families import tiny_models
from experiments.patching.kinds import ACTION, MATERIALIZED
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher

IDS = torch.tensor([[5, 6, 7, 8, 9, 10]])
STACKING = [n for n in tiny_models() if n != "tiny-gpt2"]  # GPT-2's Conv1D input matrix does not stack
GROUPING = [n for n in tiny_models() if n != "tiny-gemma3"]  # its 4 layers: 2 sliding, 2 global, no group of 3


def _pass(name: str, dtype: torch.dtype, variant: str, apply: str, batch_layers: str, device: str = "cpu"):
    patcher = Patcher(load_checked(name, dtype, device, seed=0).model, variant, apply, batch_layers=batch_layers)
    cache, query = patcher.start({"input_ids": IDS.to(device)})
    step = patcher.context_step({"input_ids": query}, cache)
    kept: dict = {}
    result = patcher.patched_pass(query, step, keep=kept)
    actions = {k: (a.coef.clone(), a.vec.clone()) for k, a in patcher.open_loop_actions().items()}
    return patcher, result, kept, actions


def _same_bits(batched, per_layer) -> None:
    (_, a, kept_a, actions_a), (_, b, kept_b, actions_b) = batched, per_layer
    assert torch.equal(a.logits, b.logits)
    assert a.hidden_linf == b.hidden_linf and a.hidden_rel == b.hidden_rel
    assert kept_a.keys() == kept_b.keys() and all(torch.equal(kept_a[k], kept_b[k]) for k in kept_a)
    assert actions_a.keys() == actions_b.keys()
    assert all(torch.equal(x, y) for k in actions_a for x, y in zip(actions_a[k], actions_b[k], strict=True))


@pytest.mark.parametrize("name", tiny_models())
def test_batched_equals_per_layer_bit_for_bit_in_float64(name):
    """`on`: the input updates stacked (all but GPT-2) and the alone passes of alike layers as one vmap (all but
    tiny Gemma 3's two pairs): the per-layer path's bits."""
    batched = _pass(name, torch.float64, "naive", MATERIALIZED, "on")
    assert (batched[0].layer_stack is not None) == (name in STACKING)
    assert (batched[0].alone_batch is not None) == (name in GROUPING)
    _same_bits(batched, _pass(name, torch.float64, "naive", MATERIALIZED, "off"))
    assert batched[1].hidden_linf[-1] > 0  # control: a pass that is compared at all (the record differs)


def _within_rounding(dtype: torch.dtype, device: str, batch_layers: str = "on") -> None:
    batched = _pass("tiny-llama", dtype, "naive", MATERIALIZED, batch_layers, device)
    assert batched[0].alone_batch is not None
    per_layer = _pass("tiny-llama", dtype, "naive", MATERIALIZED, "off", device)
    eps = torch.finfo(dtype).eps
    scale = per_layer[1].logits.abs().max()
    assert (batched[1].logits - per_layer[1].logits).abs().max() <= 64 * eps * scale
    for name, t in per_layer[2].items():
        assert (batched[2][name].float() - t.float()).abs().max() <= 64 * eps * t.float().abs().max(), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_alone_passes_agree_within_the_dtypes_rounding(dtype):
    """In float32 and bfloat16 a batched product may round in another order than a layer's own: the batched alone
    passes give the per-layer logits and patched tensors within the dtype's rounding (not asserted equal, nor
    different); `inputs` alone (the alone passes per layer) keeps every bit."""
    _within_rounding(dtype, "cpu")
    _same_bits(_pass("tiny-llama", dtype, "naive", MATERIALIZED, "inputs"),
               _pass("tiny-llama", dtype, "naive", MATERIALIZED, "off"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_the_alone_groups_agree_within_rounding(dtype):
    """On CUDA, where `auto` batches the alone passes too (vmap over cuBLAS's batched products and the GPU's
    attention): the per-layer path within the dtype's rounding."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _within_rounding(dtype, "cuda", "auto")


def test_the_alone_batch_comparison_can_fail():
    """Control: batched alone passes that read each layer's weights from the layer before (the stacks rolled)
    differ from the per-layer path."""
    patcher = Patcher(load_checked("tiny-llama", torch.float64, "cpu", seed=0).model, "naive", batch_layers="on")
    group = patcher.alone_batch.groups[0]
    group.stack.stacks = {name: stack.roll(1, 0) for name, stack in group.stack.stacks.items()}
    group.intact = lambda: True
    cache, query = patcher.start({"input_ids": IDS})
    wrong = patcher.patched_pass(query, patcher.context_step({"input_ids": query}, cache))
    right = _pass("tiny-llama", torch.float64, "naive", MATERIALIZED, "off")[1]
    assert not torch.equal(wrong.logits, right.logits)


@pytest.mark.parametrize(("variant", "apply", "dtype"), [
    ("stable", MATERIALIZED, torch.float64), ("conditioned", MATERIALIZED, torch.float64),
    ("naive", ACTION, torch.float64), ("naive", MATERIALIZED, torch.float32), ("naive", MATERIALIZED, torch.bfloat16),
    ("naive", ACTION, torch.bfloat16)])
def test_every_open_loop_and_dtype_keeps_the_bits(variant, apply, dtype):
    _same_bits(_pass("tiny-gemma3", dtype, variant, apply, "on"), _pass("tiny-gemma3", dtype, variant, apply, "off"))


def test_the_comparison_can_fail():
    """Control: a batched update that reads each layer's W_gate from the layer before (the stack rolled) differs."""
    patcher = Patcher(load_checked("tiny-llama", torch.float64, "cpu", seed=0).model, "naive", batch_layers="on")
    cache, query = patcher.start({"input_ids": IDS})
    step = patcher.context_step({"input_ids": query}, cache)
    stacks = patcher.layer_stack
    stacks.stacks["mlp.gate_proj.weight"] = stacks.stacks["mlp.gate_proj.weight"].roll(1, 0)
    stacks.intact = lambda name: True
    wrong = patcher.patched_pass(query, step)
    right = _pass("tiny-llama", torch.float64, "naive", MATERIALIZED, "off")[1]
    assert not torch.equal(wrong.logits, right.logits)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_stacking_moves_the_parameters_and_changes_no_bit(dtype):
    model = load_checked("tiny-gemma3", dtype, "cpu", seed=0).model
    before = model(input_ids=IDS).logits
    patcher = Patcher(model, "naive", batch_layers="on")
    stacks = patcher.layer_stack
    for name, stack in stacks.stacks.items():
        assert stacks.intact(name)
        assert all(p.data_ptr() % layer_stack.ALIGN_BYTES == 0 for p in stacks.params[name])
        assert stack.untyped_storage().data_ptr() == stacks.params[name][0].untyped_storage().data_ptr()
    assert torch.equal(model(input_ids=IDS).logits, before)
    params = stacks.params["mlp.up_proj.weight"]
    layer_stack.unstack(stacks)
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)  # each its own storage again
    assert torch.equal(model(input_ids=IDS).logits, before)


@pytest.mark.parametrize("offset", [0, 8, 56])
def test_a_stack_keeps_the_alignment_its_weights_had(offset):
    """Weights `offset` bytes past a 64-byte boundary (a GGUF-loaded Gemma 3 270M's float32 weights all sit 56 past
    one) sit there in the stack too, same values, same objects: MKL's float32 bits can depend on it."""
    gen = torch.Generator().manual_seed(0)
    weights = []
    for _ in range(3):
        storage = torch.empty(6 * 10 + 16)
        start = ((offset - storage.data_ptr()) % 64) // 4
        weight = storage[start:start + 60].view(6, 10).copy_(torch.randn(6, 10, generator=gen))
        weights.append(torch.nn.Parameter(weight))
    values = [w.detach().clone() for w in weights]
    stack = layer_stack.move_into_stack(weights)
    assert [w.data_ptr() % 64 for w in weights] == [offset] * 3
    assert all(w.data_ptr() == stack[i].data_ptr() and torch.equal(w, v)
               for i, (w, v) in enumerate(zip(weights, values, strict=True)))


def test_a_failed_vmap_under_auto_falls_back_in_one_line_and_on_raises(monkeypatch, caplog):
    """`auto` (a GPU this was not run on): a group whose vmap fails runs per layer from then on, the per-layer bits,
    one line said once; `on` raises it."""
    from experiments.patching import alone_batch

    def failing(*args, **kwargs):
        raise RuntimeError("no batching rule for this attention\nmore lines")

    monkeypatch.setattr(alone_batch, "_run_group", failing)
    patcher = Patcher(load_checked("tiny-llama", torch.float64, "cpu", seed=0).model, "naive", batch_layers="on")
    cache, query = patcher.start({"input_ids": IDS})
    step = patcher.context_step({"input_ids": query}, cache)
    with pytest.raises(RuntimeError, match="no batching rule"):
        patcher.patched_pass(query, step)
    patcher.alone_batch.fallback = True  # what batch_layers=auto gives
    with caplog.at_level("WARNING"):
        first, again = patcher.patched_pass(query, step), patcher.patched_pass(query, step)
    assert caplog.text.count("as one vmap failed (no batching rule for this attention); they run one at a time") == 1
    per_layer = _pass("tiny-llama", torch.float64, "naive", MATERIALIZED, "off")[1]
    assert torch.equal(first.logits, per_layer.logits) and torch.equal(again.logits, per_layer.logits)


def test_a_moved_model_falls_back_to_the_per_layer_path():
    """After the parameters leave their slots (a reload, `model.to`), the stacks (input matrices, alone groups) are
    not used, not read stale."""
    batched = _pass("tiny-llama", torch.float64, "naive", MATERIALIZED, "on")
    patcher = batched[0]
    for params in [*patcher.layer_stack.params.values(), *patcher.alone_batch.groups[0].stack.params.values()]:
        for p in params:
            p.data = p.data.clone()
    assert not any(patcher.layer_stack.intact(name) for name in patcher.layer_stack.stacks)
    assert not patcher.alone_batch.groups[0].intact()
    for stack in [*patcher.layer_stack.stacks.values(), *patcher.alone_batch.groups[0].stack.stacks.values()]:
        stack.zero_()  # what a stale read would now see
    cache, query = patcher.start({"input_ids": IDS})
    again = patcher.patched_pass(query, patcher.context_step({"input_ids": query}, cache))
    assert torch.equal(again.logits, batched[1].logits)


def test_auto_stacks_on_a_gpu_only_and_bad_inputs_are_refused():
    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model
    assert Patcher(model, "naive", batch_layers="auto").layer_stack is None  # the CPU: per layer, in cache
    with pytest.raises(ValueError, match="one of auto, on, inputs, off"):
        Patcher(model, "naive", batch_layers="yes")
    with pytest.raises(ValueError, match="closed_loop solves each layer inside the pass"):
        Patcher(model, "closed_loop", batch_layers="on")
    with pytest.raises(ValueError, match="closed_loop solves each layer inside the pass"):
        Patcher(model, "closed_loop", batch_layers="inputs")
    with pytest.raises(ValueError, match="GPT-2 has no input matrix that stacks"):
        Patcher(load_checked("tiny-gpt2", torch.float64, "cpu", seed=0).model, "naive", batch_layers="inputs")
    gpt2 = load_checked("tiny-gpt2", torch.float64, "cpu", seed=0).model
    gpt2.transformer.h = gpt2.transformer.h[:2]  # two layers: no group of three to run as one
    with pytest.raises(ValueError, match="no input matrix that stacks .* and no three layers"):
        Patcher(gpt2, "naive", batch_layers="on")


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])  # input updates stacked; and alone passes grouped
def test_a_recorded_step_replays_the_batched_pass(name):
    """The recorded token (step_graph.py, replayed here by re-running into the first run's outputs) with the layers
    batched: the tokens of plain eager generation, per layer."""
    from experiments.patching import step_graph
    from experiments.patching.generate import patched_generate

    def tokens(batch_layers, **kwargs):
        patcher = Patcher(load_checked(name, torch.float64, "cpu", seed=0).model, "naive",
                          batch_layers=batch_layers)
        return [g.token_id for g in patched_generate(patcher, {"input_ids": IDS}, 5, **kwargs)]

    eager = tokens("off")
    assert tokens("on", graphs="on", capture=step_graph.eager_capture) == eager and len(eager) == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gpus_kernels_keep_the_bits_too(monkeypatch, dtype):
    """The kernels a GPU takes (rounded.py: blocks in their own dtype, each row's own product and sum, one addcmul
    over a whole stack), run on the CPU: batched is per layer bit for bit there as well."""
    from experiments.patching import rounded

    monkeypatch.setattr(rounded, "_in_compute_dtype", lambda w, cdt: w)
    monkeypatch.setattr(rounded, "_cpu_kernels", lambda w, cdt: False)
    _same_bits(_pass("tiny-gemma3", dtype, "naive", MATERIALIZED, "on"),
               _pass("tiny-gemma3", dtype, "naive", MATERIALIZED, "off"))


def test_a_second_patcher_reuses_the_stack():
    """Another Patcher on a stacked model (patch_bench's rows, one after another) takes the storage as it is: no
    copy of the weights, the same slots."""
    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model
    first = Patcher(model, "naive", batch_layers="on").layer_stack
    second = Patcher(model, "naive", batch_layers="on").layer_stack
    for name, stack in first.stacks.items():
        assert second.stacks[name].data_ptr() == stack.data_ptr() and second.stacks[name].shape == stack.shape
        assert second.intact(name) and torch.equal(second.stacks[name], stack)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_batched_is_per_layer(dtype):
    """On CUDA, where `auto` batches: the same bits as the per-layer path, or this says where CUDA's row sums (whose
    order may depend on how many rows a kernel gets) make them differ."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    batched = _pass("tiny-gemma3", dtype, "naive", MATERIALIZED, "auto", "cuda")
    assert batched[0].layer_stack is not None  # auto stacks on a GPU
    _same_bits(batched, _pass("tiny-gemma3", dtype, "naive", MATERIALIZED, "off", "cuda"))
