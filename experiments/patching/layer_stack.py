"""Every layer's copy of an input matrix in one storage, so that the open loop patches it in all layers at
once (issue 54: `batch_layers`).

The open loop's patches depend only on the with-context step, so nothing orders the layers' input updates:
W_gate of every layer can be updated by one call over a (layers, out, in) stack instead of one call per layer
(on a GPU, a few kernels a matrix name instead of a few a layer). Stacking the weights every token would copy
them every token; instead the model's own parameters are moved, once, into the stack: each becomes a view of
its layer's slot, same values, same Parameter objects (hooks, optimizers and `named_parameters` see no
change). A slot starts at the byte offset from a 64-byte boundary its parameter had (the parameters of a loaded
model share one), so a product reads a weight at the alignment it had (MKL's float32 bits can depend on it).
The closed loop solves layer after layer inside the pass and is never batched. The alone passes of alike layers
are stacked the same way (`alone_batch.py`, `move_into_stack`).

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
BATCH_LAYERS = ("auto", "on", "inputs", "off")


@dataclass
class LayerStack:
    """name (relative to a layer) -> (layers, out, in) stack whose slot l is layer l's parameter's storage; and
    `out`, the stacked buffers the materialized updates are written to, allocated on first use."""

    stacks: dict[str, Tensor]
    params: dict[str, list[nn.Parameter]]
    out: dict[str, Tensor] = field(default_factory=dict)
    answered: dict[str, bool] = field(default_factory=dict)  # `intact`'s last answer, by name

    def intact(self, name: str) -> bool:
        """Whether every layer's parameter still lives in its slot (a `model.to(...)` or a reload moves them).
        A compiled step is traced after an eager run of it (step_graph.compiled_capture): the trace takes that run's
        answer (a data pointer is no graph's to compare)."""
        if torch.compiler.is_compiling():
            return self.answered.get(name, False)
        stack = self.stacks[name]
        self.answered[name] = all(p.data_ptr() == stack[i].data_ptr() for i, p in enumerate(self.params[name]))
        return self.answered[name]

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
    return LayerStack({name: move_into_stack(params) for name, params in found.items()}, found)


@torch.no_grad()
def move_into_stack(tensors: list[Tensor]) -> Tensor:
    """One (n, *shape) stack whose slot i is `tensors[i]`'s storage from now on: each parameter (or buffer) moved
    into its slot (`.data`), same values, same object, at the alignment it had (`_same_alignment`). Tensors that
    already are such a stack (another Patcher's) are taken as they are, with no copy."""
    stack = _already_stacked(tensors)
    if stack is not None:
        return stack
    first = tensors[0]
    per_slot = ALIGN_BYTES // first.element_size()
    slot = math.ceil(first.numel() / per_slot) * per_slot
    storage = torch.empty(len(tensors) * slot + per_slot, dtype=first.dtype, device=first.device)
    start = _same_alignment(tensors, storage)
    stack = storage.as_strided((len(tensors), *first.shape), (slot, *_contiguous_strides(first.shape)), start)
    for i, t in enumerate(tensors):
        stack[i].copy_(t)
        t.data = stack[i]
    return stack


def _same_alignment(tensors: list[Tensor], storage: Tensor) -> int:
    """Where in `storage` (elements) slot 0 starts so that every slot sits at the byte offset from a 64-byte
    boundary its tensor had: MKL's float32 products can give other bits for a weight read at another one (a GGUF
    loaded Gemma 3 270M's weights all sit 56 bytes past one; moved onto a boundary, its with-context pass changed
    in the last bits, which its naive open loop carries to O(1)). Where they sat at different offsets, slot 0 on a
    boundary (the bits of a product may then change; no loader here does that)."""
    offsets = {t.data_ptr() % ALIGN_BYTES for t in tensors}
    shift = offsets.pop() if len(offsets) == 1 else 0
    size = storage.element_size()
    if shift % size:
        return 0
    return ((shift - storage.data_ptr()) % ALIGN_BYTES) // size


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _already_stacked(tensors: list[Tensor]) -> Tensor | None:
    """The (n, *shape) view of one storage the tensors already are, slot after slot, else None."""
    first = tensors[0]
    if len(tensors) < 2 or not all(t.is_contiguous() for t in tensors):
        return None
    slot = tensors[1].storage_offset() - first.storage_offset()
    storage = first.untyped_storage().data_ptr()
    if slot < first.numel() or any(t.untyped_storage().data_ptr() != storage
                                   or t.storage_offset() != first.storage_offset() + i * slot
                                   for i, t in enumerate(tensors)):
        return None
    return first.detach().as_strided((len(tensors), *first.shape), (slot, *_contiguous_strides(first.shape)),
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
    """The input matrices' stack a Patcher patches from, or None (one layer at a time): `on` (which batches the
    alone passes too, `alone_batch.py`) and `inputs` ask for it, `auto` where it pays (a GPU: launches, not bytes,
    set a token's time there); `off` never; never for the closed loop (refused in one line when asked). `inputs`
    where nothing stacks: refused in one line."""
    if batch_layers not in BATCH_LAYERS:
        raise ValueError(f"batch_layers={batch_layers!r}: one of {', '.join(BATCH_LAYERS)}")
    if batch_layers in ("on", "inputs") and not variant.evidence:
        raise ValueError(f"batch_layers={batch_layers}: {variant.name} solves each layer inside the pass, one after "
                         "another (only an open loop's layers are batched)")
    if not batches_here(batch_layers, variant, layers):
        return None
    stack = stack_layers(adapter, layers)
    if stack is None and batch_layers == "inputs":
        raise ValueError(f"batch_layers=inputs: {adapter.family} has no input matrix that stacks across layers "
                         "(nn.Linear, one shape in every layer)")
    return stack


def batches_here(batch_layers: str, variant, layers: list[nn.Module]) -> bool:
    """Whether `batch_layers` batches anything here: an open loop, and `on`/`inputs`, or `auto` on a GPU."""
    device = next(layers[0].parameters()).device
    return variant.evidence and (batch_layers in ("on", "inputs") or (batch_layers == "auto" and device.type == "cuda"))
