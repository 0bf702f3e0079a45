"""closed_loop: each layer's patch computed inside the patched pass's own forward of that layer.

The layer runs once, its own forward with its patched tensors (`functional_call`), and two hooks fill
those tensors just before the module that reads them runs:
1. the MLP's pre-hook sees z′, the MLP input the patched pass really produced: every input matrix gets
   the input update for z′ (Thms 6–7, the router of an MoE included), so the MLP sees z_C;
2. the pre-hook of the module that owns the output parameter (Gemma's post-MLP norm, W_down, c_proj or
   fc_out, an MoE's experts) sees that module's input (d′, y′, the routing): with the original parameter
   the layer would output T′ = v′ + g(·), where v′ is the residual this pass produced; the output rule
   makes g move by r = T(C, x) − T′ (Thms 8–11), so the layer outputs the with-context T(C, x).
The adapter contract this relies on: the owner's output is what the block adds to v.

Every patched tensor is written before the module that reads it runs and is never changed afterwards,
so the pass is exactly the forward of the model with those weights: run again with them, stock, it gives
the same bits (tested). Rounding is fed back, not amplified: layer l + 1 is patched for the hidden state
layer l really produced. In exact arithmetic this is Algorithm 1's patch.

Gemma 3 and OLMo 2 (SCALE blocks ending in m ⊙ RMSNorm(W_down h)): Thm 10 alone, Δm = r ⊘ h′ with h′ =
Norm(d′), divides by the MLP's normalized outputs, some of which are near 0 on trained weights (max |Δm| up
to 1e6 on Gemma 3 270M; 2.8e4 on the random tiny-olmo2). The patched layer then amplifies any change of its
input by as much, and the exactness holds only for the bits of the pass it was solved in: a stock forward of
the same weights (whose matrix-vector products round differently, e.g. MKL's for a weight at another memory
alignment) is O(1) off by the middle layers. So `conditioned` (variant closed_loop; closed_loop_scale is Thm
10 alone) first patches W_down in its own pre-hook, by Thm 9 on its input h′, to output C · sign(d_C) (C =
RMS(d_C); `lemmas.sign_pre_norm_target`); the norm's output is then ±C/√(C² + ε) in every coordinate, and
Thm 10 divides by that. The patched layer is as sensitive to its input as the original one.

Cost per layer: one forward, plus one pass over each patched matrix (`rounded.add_rank1_by_rows`);
W_down's solve reads each row block once for T′ (or W h′) and the update together.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching import lemmas
from experiments.patching.arch.base import BlockAdapter
from experiments.patching.capture import LayerCapture, first_output, last_position, register_captures, residual
from experiments.patching.rounded import PatchBuffers, input_update_rounded
from experiments.patching.rules import OUTER_WEIGHT, LayerPatchStats
from experiments.patching.rules.base import OutputRule
from experiments.patching.rules.base import module_input as _input
from experiments.patching.taps import attach_pre


def patched_layer_forward(adapter: BlockAdapter, layer: nn.Module, cap: LayerCapture, args: tuple, kwargs: dict,
                          bufs: PatchBuffers, cdt: torch.dtype, conditioned: bool = True
                          ) -> tuple[dict, object, LayerPatchStats]:
    """The layer's forward on its input (`args`/`kwargs` as the model passed them), patched in the pass
    for the with-context values `cap`: (the values it read, its output, the patch's stats). `conditioned`:
    a SCALE block's pre-norm matrix gets its step too (see the module doc)."""
    pre_norm = adapter.pre_norm_matrix if conditioned else None
    names = (*adapter.input_matrices, *([pre_norm] if pre_norm else []), adapter.output_param)
    originals = {name: layer.get_parameter(name) for name in names}
    bufs.begin()
    for name, W in originals.items():
        bufs.out(name, W)
    values = {"x_in": last_position(_input(args, kwargs))}
    stats = LayerPatchStats()
    done: list[str] = []

    def patch_inputs(_module, a, kw):
        z = last_position(_input(a, kw))
        for name in reversed(adapter.input_matrices):  # the one the MLP reads first is written last (in cache)
            input_update_rounded(originals[name], adapter.input_matrices[name], cap.z_c, z, bufs.tensors[name], cdt)
        done.append("inputs")

    def patch_pre_norm(module, a, kw):  # Thm 9: W_down h′ = C sign(d_C), so the norm's output is ±1
        P = originals[pre_norm]
        solve_output_rule(OUTER_WEIGHT, module, P, bufs.tensors[pre_norm], a, kw,
                          lemmas.sign_pre_norm_target(cap.d_c.to(cdt)), cdt, LayerPatchStats(), adapter)
        done.append("pre_norm")

    def patch_output(module, a, kw):
        target_minus_v = cap.x_out.to(cdt) - residual(values).to(cdt)
        P = originals[adapter.output_param]
        solve_output_rule(adapter.rule, module, P, bufs.tensors[adapter.output_param], a, kw,
                          target_minus_v, cdt, stats, adapter)
        done.append("output")

    handles = register_captures(adapter, layer, values)
    handles.append(attach_pre(layer.get_submodule(adapter.mlp), patch_inputs, with_kwargs=True))
    if pre_norm:
        handles.append(attach_pre(layer.get_submodule(pre_norm.rsplit(".", 1)[0]), patch_pre_norm,
                                  with_kwargs=True))
    handles.append(attach_pre(adapter.owner(layer), patch_output, with_kwargs=True))
    try:
        output = functional_call(layer, bufs.tensors, args, kwargs)
    finally:
        for h in handles:
            h.remove()
    # a tensor the forward read was never written: its result is garbage
    if done != ["inputs", *(["pre_norm"] if pre_norm else []), "output"]:
        raise RuntimeError(f"{adapter.family}: the in-pass patch ran {done}, expected the input update "
                           "then the output rule; the adapter does not match this block")
    values["out"] = last_position(first_output(output))
    return values, output, stats


def solve_output_rule(rule: OutputRule, module: nn.Module, P: Tensor, out: Tensor, args: tuple, kwargs: dict,
                      target_minus_v: Tensor, cdt: torch.dtype, stats: LayerPatchStats,
                      adapter: BlockAdapter | None = None) -> None:
    """Write into `out` (the tensor `module` reads in place of P) the parameter that makes the layer output
    v′ + g = T(C, x), from the module's input in this pass: `rule`'s in-pass step (the adapter's own rule
    object, `patching/rules/`; never looked up by name, so a wrapped rule keeps its wrapper).
    `target_minus_v` = T(C, x) − v′; `adapter` is the block's (the MoE rule finds the experts' inputs
    through it)."""
    rule.closed_loop(adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats)
