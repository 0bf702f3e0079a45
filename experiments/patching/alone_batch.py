"""The open loop's alone passes batched across layers (issue 54 item 3; `batch_layers=on`).

A layer's alone pass (`open_loop.alone_values`: the layer run without the context on its with-context input, for
what its input matrices read) depends on the with-context step alone, as its input updates do: nothing orders the
layers. Layers that are one function of their weights run as one `torch.func.vmap` of the first one's own forward
(`functional_call`) over the group's weights, inputs and differing call tensors. One function: the same class,
the same Python state in every submodule but for an attribute that is each layer's own index (a cache slot, which
a pass of the query alone does not use), the same parameter names and shapes, and calls of one structure. Gemma 3's
sliding and global layers are two groups (the attention keeps its kind in Python attributes); a layer like no
other runs alone, as before.

The group's weights are moved into stacks once (`layer_stack.move_into_stack`, as the input matrices are): no copy
a token. Not stacked: what the pass does not run (the MLP and the modules beside it answer by their kept outputs,
`capture.StandIns`, warmed by one pass of the group's first layer, so that no batched value is kept) and a tensor
every layer of the group shares (it stays the one it is).

The values are the per-layer path's bit for bit in float64 (a test on the tiny families); in float32 and bfloat16 a
batched product rounds in its own order (a batched matmul, not a matrix-vector product) and they agree within the
dtype's rounding (a test). The CPU's attention has no batching rule: `vmap` runs it once a layer (torch's fallback,
whose warning is silenced here); every other operation runs once a group.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from experiments.core.errors import first_line
from experiments.patching import layer_stack
from experiments.patching.capture import LayerCapture, first_output
from experiments.patching.layer_stack import LayerStack, batches_here, move_into_stack
from experiments.patching.open_loop import alone_values, run_layer
from experiments.patching.rules.base import module_input

log = logging.getLogger(__name__)
warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the "
                                          "batching rule")


@dataclass
class AloneGroup:
    """Layers whose alone passes run as one: `indices` into the patcher's layers, their weights moved into stacks
    (a `LayerStack` by name relative to a layer, as the input matrices' is), and per query shape its calls' tensors
    as vmap takes them."""

    indices: list[int]
    stack: LayerStack
    # the query's hidden state (shape, dtype, device) -> its calls as one (spec, leaves, batched), or None: the
    # same key as the patcher's calls (`Patcher.query_calls`), asked here without a list's identity (which a
    # compiled step cannot trace)
    calls: dict = field(default_factory=dict)

    def intact(self) -> bool:
        """Whether every tensor still lives in its slot (`LayerStack.intact`: a `model.to(...)`, a reload or
        `unstack` moves them; the group's layers then run alone, not from stale stacks)."""
        return bool(self.stack.stacks) and all(self.stack.intact(name) for name in self.stack.stacks)


class AloneBatch:
    """The groups of a patcher's layers (`groups_for`) and their batched alone passes (`values`). `fallback`
    (batch_layers=auto): a group whose vmap fails runs its layers alone from then on, said in one line (a GPU's
    attention without a batching rule this was not tested on); asked for (`on`), the failure is raised."""

    def __init__(self, groups: list[AloneGroup], fallback: bool = False):
        self.groups = groups
        self.fallback = fallback

    def values(self, patcher, targets: list[LayerCapture], calls: list[tuple[tuple, dict]]) -> list[dict]:
        """Every layer's alone values, as `open_loop.alone_values` gives them layer by layer."""
        out: list[dict | None] = [None] * len(patcher.layers)
        for group in self.groups:
            first = group.indices[0]
            layer, (args, kwargs) = patcher.layers[first], calls[first]
            hidden = module_input(args, kwargs)
            key = (tuple(hidden.shape), hidden.dtype, hidden.device)  # what a patcher's calls depend on
            if key not in group.calls:  # the stand-ins' outputs kept unbatched (a pass of the first layer) too
                alone_values(patcher, layer, targets[first], hidden, args, kwargs)
                group.calls[key] = _common_call([calls[i] for i in group.indices])
            call = group.calls[key]
            if call is None or not group.intact():  # calls that do not batch, tensors moved: each layer alone
                continue
            try:
                stood = _run_group(patcher, layer, group, call, targets, hidden)
            except Exception as err:
                if not self.fallback:
                    raise
                log.warning("batch_layers=auto: the alone passes of layers %s as one vmap failed (%s); they run "
                            "one at a time", group.indices, first_line(err))
                group.calls[key] = None
                continue
            for j, index in enumerate(group.indices):
                out[index] = {key: value[j] for key, value in stood.items()}
        for index, values in enumerate(out):
            if values is None:
                layer, (args, kwargs) = patcher.layers[index], calls[index]
                out[index] = alone_values(patcher, layer, targets[index], module_input(args, kwargs), args, kwargs)
        return out  # type: ignore[return-value]


def _run_group(patcher, layer: nn.Module, group: AloneGroup, call: tuple, targets: list[LayerCapture],
               hidden: Tensor) -> dict[str, Tensor]:
    """The group's alone passes as one vmap of `layer`'s forward (its first layer's) over the stacks."""
    spec, leaves, batched = call
    x = torch.stack([targets[i].x_in.to(hidden.dtype).view_as(hidden) for i in group.indices])
    batched_leaves = [leaf if is_batched else None for leaf, is_batched in zip(leaves, batched, strict=True)]

    def one(params: dict, call_tensors: list, x_ref: Tensor) -> dict:
        filled = [t if is_batched else leaf for t, leaf, is_batched in zip(call_tensors, leaves, batched, strict=True)]
        args, kwargs = tree_unflatten(filled, spec)
        values = run_layer(patcher.adapter, layer, args, kwargs, x_ref, params, patcher.stand_ins)[0]
        return {key: first_output(value) for key, value in values.items()}  # a parallel block's (A, None)

    dims = [0 if is_batched else None for is_batched in batched]
    return vmap(one, in_dims=(0, dims, 0))(group.stack.stacks, batched_leaves, x)


def _common_call(calls: list[tuple[tuple, dict]]) -> tuple | None:
    flat = [tree_flatten(_without_hidden(args, kwargs)) for args, kwargs in calls]
    spec = flat[0][1]
    if any(s != spec for _, s in flat):
        return None
    leaves, batched = [], []
    for column in zip(*(leaves_ for leaves_, _ in flat), strict=True):
        first = column[0]
        if all(c is first for c in column):
            leaves.append(first)
            batched.append(False)
        elif isinstance(first, Tensor) and all(isinstance(c, Tensor) and c.shape == first.shape
                                                and c.dtype == first.dtype for c in column):
            leaves.append(torch.stack(column))
            batched.append(True)
        elif all(not isinstance(c, Tensor) and _same(c, first) for c in column):
            leaves.append(first)
            batched.append(False)
        else:
            return None
    return spec, leaves, batched


def _without_hidden(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with its hidden state left out (the alone pass runs on the with-context input instead)."""
    if args:
        return (None, *args[1:]), kwargs
    return args, {k: v for k, v in kwargs.items() if k != "hidden_states"}


def batch_for(batch_layers: str, variant, adapter, layers: list[nn.Module], inputs_stacked: bool
              ) -> AloneBatch | None:
    """The batched alone passes of `batch_layers=on` (or `auto` on a GPU), None where no group forms or it is not
    asked; `on` where neither the input matrices stack nor the alone passes group: refused in one line."""
    if batch_layers == "inputs" or not batches_here(batch_layers, variant, layers):
        return None
    groups = groups_for(adapter, layers)
    if not groups and not inputs_stacked and batch_layers == "on":
        raise ValueError(f"batch_layers=on: {adapter.family} has no input matrix that stacks across layers (nn.Linear, "
                         "one shape in every layer) and no three layers that are one function of their weights")
    return AloneBatch(groups, fallback=batch_layers == "auto") if groups else None


@torch.no_grad()
def groups_for(adapter, layers: list[nn.Module]) -> list[AloneGroup]:
    """The layers grouped into functions of their weights (the module doc), each group's weights moved into stacks;
    only groups of three layers or more (the first runs alone once more, to warm the stand-ins)."""
    skipped = (adapter.mlp, *adapter.input_modules)
    names = [n for n, _ in _tensors(layers[0]) if n not in adapter.input_matrices  # layer_stack's to stack
             and not any(n.startswith(f"{path}.") for path in skipped)]
    states = [_state(layer, skipped) for layer in layers]
    index_keys = {k for k in states[0]  # an attribute that is each layer's own index (a cache slot)
                  if all(type(state.get(k)) is int and state[k] == i for i, state in enumerate(states))}
    groups: list[list[int]] = []
    for i, layer in enumerate(layers):
        group = next((g for g in groups if _one_function(layers[g[0]], layer, states[g[0]], states[i], index_keys)),
                     None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    out = []
    for indices in groups:
        members = [layers[i] for i in indices]
        objects = {n: len({id(_tensor(m, n)) for m in members}) for n in names}
        if len(indices) < 3 or any(1 < count < len(members) for count in objects.values()):
            continue  # too few; or a tensor shared by some of them, not all: neither one stack nor one tensor
        own = [n for n in names if objects[n] == len(members)]  # a tensor all share stays the one it is
        moved = {n: [_tensor(m, n) for m in members] for n in own}
        out.append(AloneGroup(indices, LayerStack({n: move_into_stack(ts) for n, ts in moved.items()}, moved)))
    return out


def unstack(batch: AloneBatch | None) -> None:
    """Every tensor a group moved into its stacks in its own storage again (same values): `layer_stack.unstack`."""
    for group in batch.groups if batch is not None else []:
        layer_stack.unstack(group.stack)
    if batch is not None:
        batch.groups.clear()


def _tensors(layer: nn.Module):
    yield from layer.named_parameters(remove_duplicate=False)
    yield from layer.named_buffers(remove_duplicate=False)


def _layout(layer: nn.Module) -> dict[str, tuple]:
    return {name: (t.shape, t.dtype, t.device) for name, t in _tensors(layer)}


def _tensor(layer: nn.Module, name: str) -> Tensor:
    path, _, leaf = name.rpartition(".")
    module = layer.get_submodule(path) if path else layer
    return module._parameters[leaf] if leaf in module._parameters else module._buffers[leaf]


def _one_function(a: nn.Module, b: nn.Module, state_a: dict, state_b: dict, index_keys: set[str]) -> bool:
    if type(a) is not type(b) or _layout(a) != _layout(b):
        return False
    keys = (state_a.keys() | state_b.keys()) - index_keys
    return all(k in state_a and k in state_b and _same(state_a[k], state_b[k]) for k in keys)


def _state(layer: nn.Module, skipped: tuple[str, ...]) -> dict[str, object]:
    """Every submodule's Python attributes (not its parameters, buffers, submodules, hooks or private state), by
    path: what makes a module's forward differ from another's beside its weights. Not the `skipped` modules'
    (the MLP and the modules beside it: their stand-ins answer in the pass)."""
    state = {}
    for path, module in layer.named_modules():
        if any(path == s or path.startswith(f"{s}.") for s in skipped):
            continue
        for key, value in vars(module).items():
            if key.startswith("_") or key == "training" or isinstance(value, nn.Module):
                continue
            state[f"{path}:{key}"] = value
    return state


def _same(a: object, b: object) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype \
            and a.device == b.device and bool(torch.equal(a, b))
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return _same(a.func, b.func) and _same(a.args, b.args) and _same(a.keywords, b.keywords)
    if callable(a) and callable(b):  # a bound method of each instance: the same function
        return getattr(a, "__func__", a) is getattr(b, "__func__", b) and \
            (not hasattr(a, "__self__") or type(a.__self__) is type(b.__self__))
    try:
        return bool(a == b)
    except Exception:  # values whose == is no bool: alike only if the same object
        return a is b
