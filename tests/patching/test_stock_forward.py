"""The open loop's patched pass is the model's own forward: every layer's patched tensors exist before it
runs, no decoder layer's forward is replaced or intercepted during it, what each layer returns is what the
next one gets, and the pass reads nothing back to the host per layer."""

from __future__ import annotations

import collections
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

from experiments.patching.compare import logit_comparison
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher
from experiments.zoo.prompts import encode_prompt

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "Write a haiku about the first snow of winter."
OPEN_LOOPS = [("tiny-llama", "naive"), ("tiny-gemma3", "conditioned"), ("tiny-gemma3", "stable"),
              ("tiny-mixtral", "naive"), ("tiny-gpt2", "naive")]


@functools.cache
def _bundle(name: str):
    return load_checked(name, torch.float32, "cpu", seed=0)


def _step(patcher: Patcher, inputs: dict):
    ids = inputs["input_ids"]
    cache = patcher.prefill({"input_ids": ids[:, :-1]})
    return ids[:, -1:], patcher.context_step({"input_ids": ids[:, -1:]}, cache)


class _Watch:
    """Forward hooks on each decoder layer that see, during a pass: whether the layer's forward is still its
    class's own (not replaced on the instance), the hidden state it gets and what it returns."""

    def __init__(self, model, layers):
        self.replaced, self.inputs, self.outputs = [], [], []
        self.on = False  # from the model's own forward on (the patch computations call layers before it)
        self.handles = [model.register_forward_pre_hook(lambda *_: setattr(self, "on", True))]
        self.own = [type(layer).forward for layer in layers]  # the class's forward before the pass
        for index, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._before(index, layer), with_kwargs=True))
            self.handles.append(layer.register_forward_hook(self._after(index)))

    def _before(self, index, layer):
        def hook(_m, args, kwargs):
            if not self.on:
                return
            self.replaced.append("forward" in vars(layer) or type(layer).forward is not self.own[index])
            self.inputs.append((index, (args[0] if args else kwargs["hidden_states"]).detach().clone()))

        return hook

    def _after(self, index):
        def hook(_m, _args, output):
            if self.on:
                self.outputs.append((index, (output[0] if isinstance(output, tuple) else output).detach().clone()))

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def _watched(patcher, query, step, variant=None):
    watch = _Watch(patcher.model, patcher.layers)
    try:
        result = patcher.patched_pass(query, step, keep=(keep := {}), variant=variant)
    finally:
        watch.remove()
    return result, keep, watch


@pytest.mark.parametrize(("name", "variant"), OPEN_LOOPS)
def test_the_open_loop_pass_is_the_models_forward_with_no_layer_intercepted(name, variant):
    b = _bundle(name)
    patcher = Patcher(b.model, variant)
    query, step = _step(patcher, encode_prompt(b, PROMPT))
    patcher.query_calls(query)  # the calls' recording forward is not the patched pass
    result, keep, watch = _watched(patcher, query, step)
    n = len(patcher.layers)
    assert [i for i, _ in watch.inputs] == list(range(n))  # each layer once, in order: one forward
    assert not any(watch.replaced)
    for (_, out), (_, nxt) in zip(watch.outputs[:-1], watch.inputs[1:], strict=True):
        assert torch.equal(out, nxt)  # what a layer returns is what the next one gets
    # the per-layer errors are those of what the layers returned, against the record
    for (index, out), err in zip(watch.outputs, result.hidden_linf, strict=True):
        ref = step.record[index].double()
        assert err == float((out.reshape(-1, out.shape[-1])[-1].double() - ref).abs().max())
    # and the pass is the stock forward of the patched weights written into the model
    stock = patcher.stock_logits(query, keep)
    assert logit_comparison(stock, result.logits)["logit_linf_rel"] < 1e-5


def test_the_watch_sees_an_intercepted_pass():
    """The check above can fail: the closed loop (a construction) intercepts every layer's forward."""
    b = _bundle("tiny-llama")
    patcher = Patcher(b.model, "closed_loop")
    query, step = _step(patcher, encode_prompt(b, PROMPT))
    _, _, watch = _watched(patcher, query, step)
    assert all(watch.replaced)


class _Ops(TorchDispatchMode):
    """The ATen ops run while the model's own forward runs (between its forward pre-hook and its hook)."""

    def __init__(self, model):
        super().__init__()
        self.ops, self.on = collections.Counter(), False
        self.handles = [model.register_forward_pre_hook(lambda *_: setattr(self, "on", True)),
                        model.register_forward_hook(lambda *_: setattr(self, "on", False))]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += self.on
        return func(*args, **(kwargs or {}))


def _forward_ops(patcher, query, step) -> tuple[collections.Counter, collections.Counter]:
    """The ops of the patched pass's model forward, and those of the stock forward of the same query."""
    counted = _Ops(patcher.model)
    try:
        with counted:
            patcher.patched_pass(query, step)
        patched, counted.ops = counted.ops, collections.Counter()
        with counted, torch.no_grad():  # the same call: the query alone, its mask given whole
            patcher.model(input_ids=query.view(1, 1), use_cache=False, **patcher.query_mask())
    finally:
        for h in counted.handles:
            h.remove()
    return patched, counted.ops


# what the per-layer record adds to a forward: each layer's output copied (record_outputs)
COPIES = {"select", "view", "detach", "clone"}


@pytest.mark.parametrize(("name", "variant"), [("tiny-llama", "naive"), ("tiny-gemma3", "stable")])
def test_no_patch_is_computed_during_the_forward(name, variant):
    """During the open loop's forward the model runs the stock forward's ops and, beside them, only the copies
    of each layer's output: no matmul, solve or norm of a patch. Every patched tensor exists before it."""
    b = _bundle(name)
    patcher = Patcher(b.model, variant)
    query, step = _step(patcher, encode_prompt(b, PROMPT))
    patched, stock = _forward_ops(patcher, query, step)
    assert stock - patched == collections.Counter()  # the stock forward's ops, each at least as often
    assert set(patched - stock) <= COPIES, patched - stock


def test_the_op_count_sees_a_patch_computed_during_the_forward():
    """The check above can fail: the closed loop (a construction) solves each layer inside the forward."""
    b = _bundle("tiny-llama")
    patcher = Patcher(b.model, "closed_loop")
    query, step = _step(patcher, encode_prompt(b, PROMPT))
    patched, stock = _forward_ops(patcher, query, step)
    assert not set(patched - stock) <= COPIES


class _HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value back to the host (`.item()`, `float()`, `bool()`, `.tolist()`...)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def _model(family: str, layers: int):
    torch.manual_seed(0)
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if family == "gemma3":  # a post-norm block: App. B's inversion and Thm 10's division
        return Gemma3ForCausalLM(Gemma3TextConfig(**shape, head_dim=8, sliding_window=4)).eval()
    return LlamaForCausalLM(LlamaConfig(**shape)).eval()


@pytest.mark.parametrize(("family", "variant"), [("llama", "naive"), ("llama", "closed_loop"),
                                                 ("gemma3", "stable"), ("gemma3", "conditioned")])
def test_host_reads_of_one_token_do_not_grow_with_the_layers(family, variant):
    reads = {}
    for layers in (2, 6):
        patcher = Patcher(_model(family, layers), variant)
        query, step = _step(patcher, {"input_ids": torch.tensor([[3, 14, 15, 9, 26, 5]])})
        patcher.query_calls(query)
        count = _HostReads()
        with count:
            patcher.patched_pass(query, step)
        reads[layers] = count.n
    assert reads[2] == reads[6], reads
    assert reads[6] <= 2, reads  # the one read of the per-layer statistics


def test_what_the_open_loop_holds_beyond_the_model_is_the_patched_matrices_themselves():
    b = _bundle("tiny-gemma3")
    patcher = Patcher(b.model, "conditioned")
    query, step = _step(patcher, encode_prompt(b, PROMPT))
    for _ in range(2):  # token after token: the same buffers, nothing new
        tensors, _ = patcher.open_loop_tensors(query, step)
    params = dict(b.model.named_parameters())
    held = [t for bufs in patcher.layer_bufs for t in bufs._store.values()]
    assert sum(t.nbytes for t in held) == sum(params[name].nbytes for name in tensors)
    assert {t.data_ptr() for t in held} == {t.data_ptr() for t in tensors.values()}
    assert set(tensors) < set(params) and not any("embed" in name for name in tensors)  # not a copy of the model
