"""Goldwaser et al. App. B on a post-norm block (Gemma 3, OLMo 2), in the open loop.

The block ends in T = v + m ⊙ Norm(d), d = W_down h, Norm(d) = d / RMS(d), m the post-MLP norm's scale
(Gemma stores m − 1, OLMo 2 stores m: `BlockAdapter.scale_offset`). Algorithm 1's Eq. 4 moves the output
by Δm = r ⊘ Norm(d_C), which divides by MLP outputs near 0 on trained weights. App. B moves it through
W_down first: the target g = (v_C − v) + m ⊙ Norm(d_C) is inverted through m ⊙ RMSNorm to a pre-norm
vector h_target with the RMS of d_C (`app_b_inversion.invert_rms_norm`), ΔW_down = (h_target − d_C) h_Cᵀ /
‖h_C‖² makes W_down output it, and Δm absorbs the remainder, Δm = (g − m ⊙ Norm(h′_down)) ⊘ Norm(h′_down).
The conditioned variant aims W_down at C · sign(d_C) instead (`lemmas.sign_pre_norm_target`): its
normalized form is ±1 everywhere, so the last step divides by ±1.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching.app_b_inversion import invert_rms_norm
from experiments.patching.lemmas import divide_or_zero, sign_pre_norm_target
from experiments.patching.rounded import add_outer_rounded, patched_linear
from experiments.patching.rules import LayerPatchStats
from experiments.patching.rules.scale import scale_input


def stable_down_and_scale(adapter, layer: nn.Module, target, dv: Tensor, bufs, cdt: torch.dtype,
                          sign_target: bool = False) -> LayerPatchStats:
    """App. B.1 steps 1–3: W_down's rank-1 patch from the RMSNorm inversion (or to C · sign(d_C) with
    `sign_target`), then Δm for the remainder. `target` holds the with-context d_C (the post-norm's input)
    and h_C (W_down's input); dv = v_C − v. Buffers: the adapter's pre-norm matrix and output parameter."""
    post = adapter.owner(layer)
    down = layer.get_submodule(adapter.pre_norm_matrix.rsplit(".", 1)[0])
    W, scale = layer.get_parameter(adapter.pre_norm_matrix), layer.get_parameter(adapter.output_param)
    m = adapter.scale_offset + scale.double()
    f_c = scale_input(post, target.d_c, cdt).double()
    g = dv.double() + m * f_c  # the target of m ⊙ Norm(·): (v_C − v) + m ⊙ Norm(d_C)
    d_c = target.d_c.double()
    if sign_target:
        h_target, no_root = sign_pre_norm_target(d_c), torch.zeros((), dtype=torch.bool, device=d_c.device)
    else:
        h_target, no_root = invert_rms_norm(g, m, d_c.square().mean().sqrt())  # step 1
    h_c = target.values["h"].to(cdt)
    out = bufs.out(adapter.pre_norm_matrix, W)  # step 2: ΔW_down = δ h_Cᵀ / ‖h_C‖²
    add_outer_rounded(W, (h_target - d_c).to(cdt), h_c / h_c.square().sum(), out, cdt=cdt)
    # step 3: the remainder, against what the rounded W_down really outputs for h_C
    h_down = patched_linear(target.values["h"], out, down.bias)
    f_new = scale_input(post, h_down, cdt).double()
    dm, div_zero = divide_or_zero(g - m * f_new, f_new)
    dm = dm.to(cdt)
    bufs.out(adapter.output_param, scale).copy_(scale.to(cdt) + dm)
    return LayerPatchStats(div_zero=div_zero, no_root=no_root.to(torch.int64), dm_linf=dm.abs().max())
