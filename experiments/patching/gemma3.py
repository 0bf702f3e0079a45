"""Goldwaser et al. Theorem 1 on transformers' Gemma3DecoderLayer: what is Gemma-specific.

The block (modeling_gemma3.Gemma3DecoderLayer), for the query token x with context C:

    v_C = x + N_post_attn(Attn(N_in(x); C))           the attention sub-layer with its residual, A(C, x)
    z_C = N_pre_ff(v_C)                                RMSNorm before the MLP (with its scale)
    d_C = W_down (gelu_tanh(W_gate z_C) ⊙ W_up z_C)    the GeGLU MLP
    T(C, x) = v_C + m ⊙ f_C,   f_C = d_C / RMS(d_C)    post-feed-forward RMSNorm, scale m = 1 + weight

(Gemma's RMSNorm computes in float32 and scales by 1 + weight, so the paper's m is 1 + weight and a
patch Δm lands on the stored weight unchanged.) Theorem 1's ΔW_gate, ΔW_up (Eqs. 2–3) and Δm (Eq. 4)
are the lemmas of `experiments/patching/lemmas.py` (input update, elementwise scale) applied by the
shared engine (`patcher.py`) through the Gemma 3 adapter (`arch/gemma3.py`).

Here: App. B's stable update, which needs the post-MLP norm. It moves the output through W_down: the
target g = (v_C − v) + m ⊙ f_C is inverted through m ⊙ RMSNorm to a pre-norm vector h_target with the
RMS of d_C, ΔW_down = (h_target − d_C) h_gated,Cᵀ / ‖h_gated,C‖² makes W_down output it, and Δm absorbs
the remainder r = g − m ⊙ Norm(h′_down), Δm = r ⊘ Norm(h′_down) (Lemma 10's division rule).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching.gemma3_stable import invert_rms_norm
from experiments.patching.lemmas import divide_or_zero, input_update, scale_update, sign_pre_norm_target

GATE, UP, DOWN, SCALE = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                         "post_feedforward_layernorm.weight")
input_patch_factors = input_update  # Eqs. 2–3 (Thm 7)
__all__ = ["GATE", "UP", "DOWN", "SCALE", "divide_or_zero", "input_patch_factors", "scale_patch",
           "rms_normalize", "stable_down_and_scale"]


def scale_patch(v_c: Tensor, v: Tensor, f_c: Tensor) -> tuple[Tensor, int]:
    """Δm = (v_C − v) ⊘ f_C (Eq. 4): Thm 10's elementwise-scale update with r = v_C − v."""
    return scale_update(v_c - v, f_c)


def rms_normalize(norm: nn.Module, x: Tensor) -> Tensor:
    """Gemma3RMSNorm without its scale: x / sqrt(mean(x²) + eps), in float32 as the module computes (float64
    for a float64 model, whose norms compute in float64: zoo/float64.py)."""
    return norm._norm(x.float() if x.dtype != torch.float64 else x)


def stable_down_and_scale(layer: nn.Module, cap, dv: Tensor, bufs, cdt, sign_target: bool = False):
    """App. B.1 steps 1–3: W_down's rank-1 patch from the RMSNorm inversion, then Δm for the remainder.
    `cap` holds the with-context d_C (post-norm input) and h_gated,C (down_proj input); dv = v_C − v.
    `sign_target` (variant conditioned): step 1's target is C · sign(d_C) instead of App. B's inversion
    (lemmas.sign_pre_norm_target), whose normalized form is ±1 everywhere: step 3's Δm then divides by
    ±1, where App. B's divides by the inversion's coordinates, which can be near 0 like Eq. 4's."""
    from experiments.patching.output_rules import LayerPatchStats
    from experiments.patching.rounded import add_outer_rounded

    post, W = layer.post_feedforward_layernorm, layer.mlp.down_proj.weight
    m = 1.0 + post.weight.double()
    f_c = rms_normalize(post, cap.d_c).double()
    g = dv.double() + m * f_c  # target of m ⊙ Norm(·): (v_C − v) + h_out,C
    d_c = cap.d_c.double()
    target_rms = float(d_c.square().mean().sqrt())
    if sign_target:
        h_target, no_root = sign_pre_norm_target(d_c), False
    else:
        h_target, no_root = invert_rms_norm(g, m, target_rms)  # step 1
    h_gated = cap.h_gated_c.to(cdt)
    delta = (h_target - d_c).to(cdt)
    out = bufs.out(DOWN, W)  # step 2: ΔW_down = δ h_gated,Cᵀ / ‖h_gated,C‖²
    add_outer_rounded(W, delta, h_gated / h_gated.square().sum(), out, cdt=cdt)
    # step 3: the remainder, against what the rounded W_down really outputs for h_gated,C
    h_down = nn.functional.linear(cap.h_gated_c, out)
    f_new = rms_normalize(post, h_down).double()
    dm, div_zero = divide_or_zero(g - m * f_new, f_new)
    dm = dm.to(cdt)
    bufs.out(SCALE, post.weight).copy_(post.weight.to(cdt) + dm)
    return LayerPatchStats(div_zero=div_zero, no_root=int(no_root), dm_linf=float(dm.abs().max()))
