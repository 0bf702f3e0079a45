"""What the patching reads off a decoder layer's forward: hooks that keep the values an adapter names
(the layer's input and output, the residual v before the MLP or a parallel block's attention output, the
MLP input z, each per-matrix input beside it as "z@MODULE", the output rule's inputs) at the query position,
the last one of the sequence. The hooks attach through taps.py (one placed pair a module, so that a patched
generation registers no torch hook after its first token and its step compiles once).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor, nn
from torch.utils._pytree import tree_map_only

from experiments.patching.block import Block
from experiments.patching.taps import attach_post, attach_pre, replace_forward


class StandIns:
    """What the MLP and the modules beside it whose inputs a matrix reads (`input_at`) return in a pass that
    needs only their inputs (the open loop's alone pass): the output of their own forward the first time they
    are called with an input of that shape and dtype, kept, and returned unchanged after. So the MLP's
    matrices run once per module and shape, not per pass, and the pass runs to the layer's end with nothing
    raised to stop it (issue 54: no exception as control flow in a step that is recorded or compiled). What
    the rest of the layer makes of a kept output is not read (`run_layer` returns no output for such a pass).
    That no input the pass reads depends on them is a property of the block, which the family check holds
    (`arch/check.py`: stale stand-ins, the same inputs bit for bit)."""

    def __init__(self):
        self.outputs: dict = {}

    def forward_of(self, module: nn.Module):
        own = type(module).forward

        def forward(*args, **kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            key = (id(module), tuple(x.shape), x.dtype)
            if key not in self.outputs:
                self.outputs[key] = tree_map_only(Tensor, Tensor.detach, own(module, *args, **kwargs))
            return self.outputs[key]

        return forward


def last_position(t):
    """The query position of a captured tensor ((1, T, d) or (T, k)), or of each tensor of a tuple."""
    if isinstance(t, tuple):
        return tuple(last_position(x) for x in t)
    if t is None:  # e.g. attention weights that were not asked for (GPT-J's attention returns (A, None))
        return None
    return t.reshape(-1, t.shape[-1])[-1].detach().clone()


def first_output(out):
    return out[0] if isinstance(out, tuple) else out


@dataclass
class LayerCapture:
    """One decoder layer's values at the query position: `x_in`, `out`, `v` (or `attn`), `z` and the
    output rule's inputs (`y`, `d`, `h`, `router`), keyed by name."""

    values: dict = field(default_factory=dict)

    x_in = property(lambda self: self.values.get("x_in"))
    x_out = property(lambda self: self.values.get("out"))
    v_c = property(lambda self: self.values.get("v"))
    z_c = property(lambda self: self.values.get("z"))
    d_c = property(lambda self: self.values.get("d"))
    h_gated_c = property(lambda self: self.values.get("h"))


def _module(layer: nn.Module, path: str) -> nn.Module:
    return layer.get_submodule(path)


def register_captures(adapter: Block, layer: nn.Module, values: dict, stand_ins: StandIns | None = None) -> list:
    """Hooks recording the adapter's values into `values` (query position). With `stand_ins`, only v (or the
    attention's output) and what the input matrices read (z, and the inputs of the modules beside the MLP), the
    MLP and those modules answering by `stand_ins` instead of running."""
    handles = []

    def keep_input(name: str):
        def hook(_m, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            values[name] = last_position(x)

        return hook

    def keep_output(name: str):
        def hook(_m, _args, output):
            values[name] = last_position(output)

        return hook

    if adapter.residual_at:
        handles.append(attach_pre(_module(layer, adapter.residual_at), keep_input("v")))
    else:
        handles.append(attach_post(_module(layer, adapter.attention), keep_output("attn")))
    inputs = {adapter.mlp: "z", **{path: f"z@{path}" for path in adapter.input_modules}}
    for path, name in inputs.items():
        module = _module(layer, path)
        handles.append(attach_pre(module, keep_input(name), with_kwargs=True))
        if stand_ins is not None:
            handles.append(replace_forward(module, stand_ins.forward_of(module)))
    if stand_ins is not None:
        return handles
    for name, (path, where) in adapter.captures.items():
        m = _module(layer, path)
        handles.append(attach_pre(m, keep_input(name), with_kwargs=True) if where == "input"
                       else attach_post(m, keep_output(name)))
    return handles


def residual(values: dict) -> Tensor:
    """v: read before the MLP, or x + A for a parallel block (Thm 12)."""
    if "v" in values:
        return values["v"]
    return values["x_in"] + first_output(values["attn"])


@contextmanager
def capture_context(adapter: Block, layers: nn.ModuleList) -> Iterator[list[LayerCapture]]:
    """Record every layer's values at the query position during a with-context forward."""
    caps = [LayerCapture() for _ in layers]
    handles = []

    def keep_in(cap):
        def hook(_m, args, kwargs):
            cap.values["x_in"] = last_position(args[0] if args else kwargs["hidden_states"])

        return hook

    def keep_out(cap):
        def hook(_m, _args, _kwargs, output):
            cap.values["out"] = last_position(first_output(output))

        return hook

    for layer, cap in zip(layers, caps, strict=True):
        handles += [attach_pre(layer, keep_in(cap), with_kwargs=True),
                    attach_post(layer, keep_out(cap), with_kwargs=True)]
        handles += register_captures(adapter, layer, cap.values)
    try:
        yield caps
    finally:
        for h in handles:
            h.remove()


@contextmanager
def record_outputs(layers: nn.ModuleList) -> Iterator[list[Tensor]]:
    """Each layer's output at the query position, by forward hooks of their own into a list of their own:
    the record that per-layer errors are measured against, independent of the targets handed to solvers
    (`capture_context`), so that a solver given wrong targets cannot agree with it by construction."""
    record: list[Tensor | None] = [None] * len(layers)

    def keep(index: int):
        def hook(_m, _args, output):
            record[index] = last_position(first_output(output))

        return hook

    handles = [attach_post(layer, keep(i)) for i, layer in enumerate(layers)]
    try:
        yield record  # type: ignore[misc]
    finally:
        for h in handles:
            h.remove()
