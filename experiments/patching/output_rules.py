"""The output rules of Table 1 applied to a decoder layer: make the outer function's output move by a
residual r, writing the changed parameter rounded into the layer's patch buffers.

Two callers: the open loop (naive, Algorithm 1) has r = v_C − v and reads y, d, the routing from the
with-context pass; the closed loop (`closed_loop.py`) solves for r inside the patched pass itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.patching import lemmas
from experiments.patching.arch.base import MOE, OUTER_BIAS, OUTER_WEIGHT, SCALE, BlockAdapter
from experiments.patching.rounded import PatchBuffers, add_outer_rounded


@dataclass
class LayerPatchStats:
    div_zero: int = 0  # coordinates where a division (Thm 10, App. B) was undefined
    no_root: int = 0  # 1 when App. B's multiplier equation had no root on (−∞, min m²)
    dm_linf: float = 0.0  # max |Δ| of the output parameter (Δm, Δb, or ΔW′'s factor r)
    routing_changed: int = 0  # MoE: 1 when the patched pass picked other experts than the context pass


def owner(adapter: BlockAdapter, layer: nn.Module) -> nn.Module:
    """The module whose parameter the output rule changes (post-MLP norm, W_down, c_proj, the experts)."""
    return layer.get_submodule(adapter.output_param.rsplit(".", 1)[0])


def scale_input(norm: nn.Module, d: Tensor, cdt: torch.dtype) -> Tensor:
    """h = d / RMS(d), what Gemma's post-MLP RMSNorm multiplies by its scale, computed as the norm does:
    in float32 (transformers), in float64 for float64 models (zoo/float64.py); `cdt` is that dtype."""
    return norm._norm(d.to(cdt))


def apply_output_rule(adapter: BlockAdapter, layer: nn.Module, r: Tensor, values: dict, bufs: PatchBuffers,
                      cdt: torch.dtype) -> LayerPatchStats:
    """Open loop (Algorithm 1): the outer function's output moves by r, with y, d and the routing read
    from the with-context pass (`values`)."""
    stats = LayerPatchStats()
    P = layer.get_parameter(adapter.output_param)
    out = bufs.out(adapter.output_param, P)
    if adapter.output_rule == OUTER_BIAS:  # Thm 8
        db = lemmas.outer_bias_update(r)
        out.copy_(P.to(cdt) + db)
        stats.dm_linf = float(db.abs().max())
    elif adapter.output_rule == OUTER_WEIGHT:  # Thm 9
        u, s = lemmas.outer_weight_update(r, values["y"].to(cdt))
        add_outer_rounded(P, u, s, out, cdt=cdt)
        stats.dm_linf = float(r.abs().max())
    elif adapter.output_rule == SCALE:  # Thm 10
        dm, stats.div_zero = lemmas.scale_update(r, scale_input(owner(adapter, layer), values["d"], cdt))
        out.copy_(P.to(cdt) + dm)
        stats.dm_linf = float(dm.abs().max())
    elif adapter.output_rule == MOE:  # Thm 11
        _logits, gates, index = values["router"]
        moe_down_rounded(layer.mlp.experts, P, out, layer.mlp.experts.gate_up_proj, values["z"], index, gates, r, cdt)
        stats.dm_linf = float(r.abs().max())
    else:
        raise ValueError(f"unknown output rule {adapter.output_rule!r}")
    return stats


def moe_down_rounded(experts: nn.Module, P: Tensor, out: Tensor, gate_up: Tensor, z: Tensor, index: Tensor,
                     gates: Tensor, r: Tensor, cdt: torch.dtype) -> None:
    """Thm 11: each active expert's W_down,j gets ΔW′_j y_j = r / S, y_j its hidden state for z through
    `gate_up` (as MixtralExperts.forward computes it); the other experts keep W_down,j. Written rounded."""
    active = index.reshape(-1).tolist()
    ys = []
    for j in active:
        g, u = nn.functional.linear(z.reshape(-1), gate_up[j]).chunk(2, dim=-1)
        ys.append((experts.act_fn(g) * u).to(cdt))
    out.copy_(P)
    for j, (u, s) in zip(active, lemmas.moe_updates(r, gates.reshape(-1).to(cdt), torch.stack(ys)), strict=True):
        out[j].copy_(torch.addr(P[j].to(cdt), u, s))
