"""The open loop (Algorithm 1, App. B): a layer's patch computed from the with-context pass alone.

Each layer's patch is computed against the with-context pass's input to the layer, x_{l−1} (the target),
whatever hidden state the patched pass really brings: the layer runs once without the context on
x_{l−1} (for what a matrix reads: v, z, and each per-matrix input beside the MLP; the MLP itself stood in
for by a kept output, `capture.StandIns`), every
input matrix gets the rank-1 input update from what it reads (Thms 6–7, an MoE's router included), and
the output step makes the outer function's output move by r = v_C − v (Thms 8–12; App. B's for a
post-norm block). Then the layer runs its own forward, with W + ΔW rounded to the model's
dtype, on the real hidden state. The patched pass's input differs from x_{l−1} by rounding (and, with
learned absolute positions, by the position embedding): errors propagate, which is what the paper's
method is measured on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching.capture import (
    LayerCapture,
    StandIns,
    first_output,
    last_position,
    register_captures,
    residual,
)
from experiments.patching.kinds import ACTION
from experiments.patching.layer_stack import LayerStack
from experiments.patching.output_rules import LayerPatchStats, apply_output_rule
from experiments.patching.rounded import input_update_rounded
from experiments.patching.rules.base import module_input

# (patcher, layer, with-context values, r = v_C − v) -> the output step's stats, buffers filled
OutputStep = Callable[..., LayerPatchStats]


def run_layer(adapter, layer: nn.Module, args: tuple, kwargs: dict, hidden: Tensor, params: dict,
              stand_ins: StandIns | None = None) -> tuple[dict, object]:
    """The layer's own forward on `hidden` with `params` substituted, recording the adapter's values at the
    query position. With `stand_ins` only what the input matrices read (the MLP and the modules beside it
    answer by kept outputs): no output, which would be made of them."""
    values = {"x_in": last_position(hidden)}
    if args:
        args = (hidden, *args[1:])
    else:
        kwargs = dict(kwargs, hidden_states=hidden)
    handles = register_captures(adapter, layer, values, stand_ins)
    try:
        output = functional_call(layer, params, args, kwargs)
    finally:
        for h in handles:
            h.remove()
    if stand_ins is not None:
        return values, None
    values["out"] = last_position(first_output(output))
    return values, output


def alone_values(patcher, layer: nn.Module, target: LayerCapture, hidden: Tensor, args: tuple,
                 kwargs: dict) -> dict:
    """The layer run without the context on the with-context input `target.x_in` (whatever the patched pass's
    `hidden` is), for what the input matrices read: v and z(s), the MLP stood in for (`patcher.stand_ins`)."""
    x_ref = target.x_in.to(hidden.dtype).view_as(hidden)
    return run_layer(patcher.adapter, layer, args, kwargs, x_ref, {}, patcher.stand_ins)[0]


def fill(patcher, layer: nn.Module, target: LayerCapture, hidden: Tensor, args: tuple, kwargs: dict,
         output_step: OutputStep) -> LayerPatchStats:
    """Fill `patcher.bufs` with this layer's patched tensors, computed against the with-context input
    `target.x_in`, whatever the patched pass's `hidden` is."""
    adapter, cdt, bufs = patcher.adapter, patcher.cdt, patcher.bufs
    bufs.begin()
    alone = alone_values(patcher, layer, target, hidden, args, kwargs)
    for name, layout in adapter.input_matrices.items():  # Thms 6–7 (+ the router, Thm 11)
        W, key = layer.get_parameter(name), adapter.input_key(name)  # z, or the matrix's own input
        input_update_rounded(W, layout, target.values[key], alone[key], bufs.out(name, W), cdt)
    return output_step(patcher, layer, target, _residual_change(target, alone, cdt))


def _residual_change(target: LayerCapture, alone: dict, cdt: torch.dtype) -> Tensor:
    return residual(target.values).to(cdt) - residual(alone).to(cdt)  # v_C − v (Thm 12: A_C − A)


def fill_all(patcher, targets: list[LayerCapture], calls: list[tuple[tuple, dict]], layer_stack: LayerStack | None,
             output_step: OutputStep, alone_batch=None) -> list[LayerPatchStats]:
    """Every layer's patched tensors into its buffers (`patcher.layer_bufs`), as `fill` layer after layer, with
    each stacked input matrix (`layer_stack.py`) updated in all layers by one call: every layer alone on its
    with-context input first (alike layers as one where `alone_batch`, an alone_batch.AloneBatch, is given), then
    the input updates matrix name by matrix name, then each layer's output step. The same bits as `fill` where the
    alone passes are not batched: a stack's blocks are the rows a layer alone gets, and the update is elementwise
    (`rounded.add_rank1_by_rows`); batched alone passes keep them in float64 and round in their own order below
    (alone_batch.py)."""
    adapter, cdt = patcher.adapter, patcher.cdt
    for bufs in patcher.layer_bufs:
        bufs.begin()
    if alone_batch is not None:
        alones = alone_batch.values(patcher, targets, calls)
    else:
        alones = [alone_values(patcher, layer, target, module_input(args, kwargs), args, kwargs)
                  for layer, target, (args, kwargs) in zip(patcher.layers, targets, calls, strict=True)]
    stacked: dict[str, tuple[Tensor, Tensor]] = {}  # input key -> every layer's (z_C, z): gate and up share z
    for name, layout in adapter.input_matrices.items():  # Thms 6–7 (+ the router, Thm 11)
        key = adapter.input_key(name)
        if layer_stack is not None and name in layer_stack.stacks and layer_stack.intact(name):
            if key not in stacked:
                stacked[key] = (torch.stack([target.values[key] for target in targets]),
                                torch.stack([alone[key] for alone in alones]))
            input_update_rounded(layer_stack.stacks[name], layout, *stacked[key],
                                 _stacked_out(patcher, layer_stack, name), cdt)
            continue
        for layer, target, alone, bufs in zip(patcher.layers, targets, alones, patcher.layer_bufs, strict=True):
            W = layer.get_parameter(name)
            input_update_rounded(W, layout, target.values[key], alone[key], bufs.out(name, W), cdt)
    stats = []
    for index, (layer, target, alone) in enumerate(zip(patcher.layers, targets, alones, strict=True)):
        patcher.bufs = patcher.layer_bufs[index]
        stats.append(output_step(patcher, layer, target, _residual_change(target, alone, cdt)))
    return stats


def _stacked_out(patcher, layer_stack: LayerStack, name: str) -> Tensor | list:
    """Where a stacked update goes: each layer's kept action (apply=action), or one (layers, out, in) buffer
    whose slot l is layer l's patched tensor (materialized)."""
    stack = layer_stack.stacks[name]
    if patcher.apply == ACTION:
        return [bufs.out(name, stack[index]) for index, bufs in enumerate(patcher.layer_bufs)]
    buffer = layer_stack.out_buffer(name, patcher.dtype)
    for index, bufs in enumerate(patcher.layer_bufs):
        bufs.tensors[name] = buffer[index]
    return buffer


def patch_and_run(patcher, layer: nn.Module, target: LayerCapture, args: tuple, kwargs: dict,
                  output_step: OutputStep) -> tuple[dict, object, LayerPatchStats]:
    hidden = module_input(args, kwargs)
    stats = fill(patcher, layer, target, hidden, args, kwargs, output_step)
    values, output = run_layer(patcher.adapter, layer, args, kwargs, hidden, patcher.bufs.tensors)
    return values, output, stats


def output_rule_step(patcher, layer: nn.Module, target: LayerCapture, r: Tensor) -> LayerPatchStats:
    """Algorithm 1's output step: the block's Table 1 rule, with y, d, the routing read from the with-context
    pass."""
    return apply_output_rule(patcher.adapter, layer, r, target.values, patcher.bufs, patcher.cdt)


def stable_step(sign_target: bool) -> OutputStep:
    """App. B's output step (`app_b.py`): W_down from the RMSNorm inversion (or to C · sign(d_C), the
    conditioned variant), then the post-MLP scale for the remainder."""
    from experiments.patching.app_b import stable_down_and_scale

    def step(patcher, layer, target, r):
        return stable_down_and_scale(patcher.adapter, layer, target, r, patcher.bufs, patcher.cdt, sign_target)

    return step
