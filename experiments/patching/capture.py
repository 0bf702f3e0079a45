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

from experiments.patching.block import Block
from experiments.patching.taps import attach_post, attach_pre


class StopAtMLP(Exception):
    """Raised by a hook once every input the input matrices read is known (the MLP's, and each per-matrix
    input beside it): the rest of the layer is not needed."""


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


def register_captures(adapter: Block, layer: nn.Module, values: dict, stop_at_mlp: bool = False) -> list:
    """Hooks recording the adapter's values into `values` (query position); `stop_at_mlp` aborts the
    forward once every input an input matrix reads is known (raises StopAtMLP): z, and the inputs of the
    modules beside the MLP (`input_at`), whichever the forward reaches last."""
    handles = []
    inputs = ("z", *(f"z@{path}" for path in adapter.input_modules))

    def keep_input(name: str, stop: bool = False):
        def hook(_m, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            values[name] = last_position(x)
            if stop and all(key in values for key in inputs):
                raise StopAtMLP

        return hook

    def keep_output(name: str):
        def hook(_m, _args, output):
            values[name] = last_position(output)

        return hook

    if adapter.residual_at:
        handles.append(attach_pre(_module(layer, adapter.residual_at), keep_input("v")))
    else:
        handles.append(attach_post(_module(layer, adapter.attention), keep_output("attn")))
    handles.append(attach_pre(_module(layer, adapter.mlp), keep_input("z", stop_at_mlp), with_kwargs=True))
    for path in adapter.input_modules:
        handles.append(attach_pre(_module(layer, path), keep_input(f"z@{path}", stop_at_mlp), with_kwargs=True))
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
