"""Every layer's copy of an input matrix in one storage, so that the open loop patches it in all layers at
once (issue 54: `batch_layers`).

The open loop's patches depend only on the with-context step, so nothing orders the layers' input updates:
W_gate of every layer can be updated by one call over a (layers, out, in) stack instead of one call per layer
(on a GPU, a few kernels a matrix name instead of a few a layer). Stacking the weights every token would copy
them every token; instead the model's own parameters are moved, once, into the stack: each becomes a view of
its layer's slot, same values, same Parameter objects (hooks, optimizers and `named_parameters` see no
change). A slot starts on a 64-byte boundary, as torch's allocator puts any tensor, so a product reads a
weight at the alignment it had (MKL's bits can depend on it). The closed loop solves layer after layer inside
the pass and is never batched.

A model whose weights share one storage cannot be saved by safetensors as it is: `unstack` gives every
parameter its own storage again (the experiments that save a model never stack it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.patching.kinds import LINEAR

ALIGN_BYTES = 64
BATCH_LAYERS = ("auto", "on", "off")


@dataclass
class LayerStack:
    """name (relative to a layer) -> (layers, out, in) stack whose slot l is layer l's parameter's storage; and
    `out`, the stacked buffers the materialized updates are written to, allocated on first use."""

    stacks: dict[str, Tensor]
    params: dict[str, list[nn.Parameter]]
    out: dict[str, Tensor] = field(default_factory=dict)

    def intact(self, name: str) -> bool:
        """Whether every layer's parameter still lives in its slot (a `model.to(...)` or a reload moves them)."""
        stack = self.stacks[name]
        return all(p.data_ptr() == stack[i].data_ptr() for i, p in enumerate(self.params[name]))

    def out_buffer(self, name: str, dtype: torch.dtype) -> Tensor:
        stack = self.stacks[name]
        buf = self.out.get(name)
        if buf is None or buf.dtype != dtype or buf.device != stack.device:
            buf = self.out[name] = torch.empty(stack.shape, dtype=dtype, device=stack.device)
        return buf


def stackable(adapter, layers: list[nn.Module]) -> dict[str, list[nn.Parameter]]:
    """The input matrices that stack: nn.Linear layout, present in every layer, one shape, dtype and device,
    each layer's its own (no weight shared between layers)."""
    found = {}
    for name, layout in adapter.input_matrices.items():
        if layout != LINEAR:
            continue
        params = [layer.get_parameter(name) for layer in layers]
        first = params[0]
        same = all(p.shape == first.shape and p.dtype == first.dtype and p.device == first.device for p in params)
        if same and first.dim() == 2 and len({id(p) for p in params}) == len(params):
            found[name] = params
    return found


@torch.no_grad()
def stack_layers(adapter, layers: list[nn.Module]) -> LayerStack | None:
    """Move each stackable input matrix of every layer into one aligned storage (None: nothing stacks)."""
    found = stackable(adapter, layers)
    if not found:
        return None
    stacks = {}
    for name, params in found.items():
        stacks[name] = _already_stacked(params)
        if stacks[name] is not None:  # another Patcher on this model stacked them: its storage, no copy
            continue
        first = params[0]
        rows, cols = first.shape
        per_slot = ALIGN_BYTES // first.element_size()
        slot = math.ceil(rows * cols / per_slot) * per_slot
        storage = torch.empty(len(params) * slot, dtype=first.dtype, device=first.device)
        stack = storage.as_strided((len(params), rows, cols), (slot, cols, 1))
        for i, p in enumerate(params):
            stack[i].copy_(p)
            p.data = stack[i]
        stacks[name] = stack
    return LayerStack(stacks, found)


def _already_stacked(params: list[nn.Parameter]) -> Tensor | None:
    """The (layers, out, in) view of one storage the parameters already are, slot after slot, else None."""
    first = params[0]
    if len(params) < 2 or not all(p.is_contiguous() for p in params):
        return None
    slot = params[1].storage_offset() - first.storage_offset()
    storage = first.untyped_storage().data_ptr()
    if slot < first.numel() or any(p.untyped_storage().data_ptr() != storage
                                   or p.storage_offset() != first.storage_offset() + i * slot
                                   for i, p in enumerate(params)):
        return None
    return first.detach().as_strided((len(params), *first.shape), (slot, first.shape[1], 1),
                                     first.storage_offset())


@torch.no_grad()
def unstack(layer_stack: LayerStack | None) -> None:
    """Every stacked parameter in its own storage again (same values)."""
    if layer_stack is None:
        return
    for params in layer_stack.params.values():
        for p in params:
            p.data = p.data.clone()
    layer_stack.stacks.clear()
    layer_stack.params.clear()
    layer_stack.out.clear()


def stack_for(batch_layers: str, variant, adapter, layers: list[nn.Module]) -> LayerStack | None:
    """The stack a Patcher patches from, or None (one layer at a time): `auto` where it pays (a GPU: launches,
    not bytes, set a token's time there) and the variant is an open loop; `on` asks for it (refused in one line
    for the closed loop, or where nothing stacks); `off` never."""
    if batch_layers not in BATCH_LAYERS:
        raise ValueError(f"batch_layers={batch_layers!r}: one of {', '.join(BATCH_LAYERS)}")
    if batch_layers == "on" and not variant.evidence:
        raise ValueError(f"batch_layers=on: {variant.name} solves each layer inside the pass, one after another "
                         "(only an open loop's layers are batched)")
    device = next(layers[0].parameters()).device
    if not variant.evidence or batch_layers == "off" or (batch_layers == "auto" and device.type != "cuda"):
        return None
    stack = stack_layers(adapter, layers)
    if stack is None and batch_layers == "on":
        raise ValueError(f"batch_layers=on: {adapter.family} has no input matrix that stacks across layers "
                         "(nn.Linear, one shape in every layer)")
    return stack
