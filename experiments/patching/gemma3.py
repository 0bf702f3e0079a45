"""Goldwaser et al. Theorem 1 on transformers' Gemma3DecoderLayer: the context as weight patches.

The block (modeling_gemma3.Gemma3DecoderLayer), for the query token x with context C:

    v_C = x + N_post_attn(Attn(N_in(x); C))           the attention sub-layer with its residual, A(C, x)
    z_C = N_pre_ff(v_C)                                RMSNorm before the MLP (with its scale)
    d_C = W_down (gelu_tanh(W_gate z_C) ⊙ W_up z_C)    the GeGLU MLP
    T(C, x) = v_C + m ⊙ f_C,   f_C = d_C / RMS(d_C)    post-feed-forward RMSNorm, scale m = 1 + weight

(Gemma's RMSNorm computes in float32 and scales by 1 + weight, so the paper's m is 1 + weight and a
patch Δm lands on the stored weight unchanged.) With the reduced context empty the block sees x
alone: v = A(∅, x), z = N_pre_ff(v). Theorem 1 moves the whole context effect into

    ΔW_gate = W_gate (z_C − z) zᵀ / ‖z‖²      (Eq. 2)   so that (W_gate + ΔW_gate) z = W_gate z_C
    ΔW_up   = W_up   (z_C − z) zᵀ / ‖z‖²      (Eq. 3)
    Δm      = (v_C − v) ⊘ f_C                 (Eq. 4)   so that v + (m + Δm) ⊙ f_C = v_C + m ⊙ f_C.

Division rule for Eq. 4 (the theorem assumes f_C has no zero): where f_C,i = 0, or where the quotient
is not finite, coordinate i of the output cannot be moved by m (Lemma 10); we set Δm_i = 0 there,
leave (v_C − v)_i uncorrected, and count the coordinates (`div_zero`).

The stable variant (App. B, `gemma3_stable`) instead moves the output through W_down: the target
g = (v_C − v) + m ⊙ f_C is inverted through m ⊙ RMSNorm to a pre-norm vector h_target with the RMS of
d_C, ΔW_down = (h_target − d_C) h_gated,Cᵀ / ‖h_gated,C‖² makes W_down output it, and Δm absorbs the
remainder r = g − m ⊙ Norm(h′_down), Δm = r ⊘ Norm(h′_down) (same division rule).

Patched weights are materialized as W + ΔW rounded to the model's dtype (what a user editing the
checkpoint would get) into buffers reused by every layer and every token, and the layer then runs
its own forward with them (`torch.func.functional_call`). Patch arithmetic is float32 (float64 for
float64 models); only the sum is rounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching.gemma3_stable import invert_rms_norm

VARIANTS = ("naive", "stable")
GATE, UP, DOWN, SCALE = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                         "post_feedforward_layernorm.weight")


# -- Theorem 1, as pure functions on vectors ---------------------------------------------------------
def input_patch_factors(W: Tensor, z_c: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """ΔW = u sᵀ of Eqs. 2–3, as its factors u = W (z_C − z) and s = z / ‖z‖² (needs z ≠ 0)."""
    sq = z.square().sum()
    if float(sq) == 0.0:
        raise ValueError("z = 0: the rank-1 input patch is undefined (Lemma 6 needs z ≠ 0)")
    return W @ (z_c - z), z / sq


def divide_or_zero(numerator: Tensor, denominator: Tensor) -> tuple[Tensor, int]:
    """numerator ⊘ denominator, 0 where the denominator is 0 or the quotient is not finite; and how many."""
    q = numerator / denominator
    bad = ~torch.isfinite(q)
    return torch.where(bad, torch.zeros_like(q), q), int(bad.sum())


def scale_patch(v_c: Tensor, v: Tensor, f_c: Tensor) -> tuple[Tensor, int]:
    """Δm = (v_C − v) ⊘ f_C (Eq. 4) with the division rule above; returns (Δm, div_zero count)."""
    return divide_or_zero(v_c - v, f_c)


def rms_normalize(norm: nn.Module, x: Tensor) -> Tensor:
    """Gemma3RMSNorm without its scale: x / sqrt(mean(x²) + eps), in float32 as the module computes."""
    return norm._norm(x.float())


# -- what the with-context pass leaves behind ---------------------------------------------------------
@dataclass
class LayerCapture:
    """One decoder layer's activations at the query position in the pass with the context."""

    x_in: Tensor | None = None  # the layer's input (Algorithm 1's target from the layer below)
    v_c: Tensor | None = None  # A(C, x): input of pre_feedforward_layernorm
    h_gated_c: Tensor | None = None  # input of down_proj
    d_c: Tensor | None = None  # output of down_proj: input of post_feedforward_layernorm
    x_out: Tensor | None = None  # the layer's output T(C, x): the target


@contextmanager
def capture_query_activations(layers: nn.ModuleList) -> Iterator[list[LayerCapture]]:
    """Record, for each layer, the last position's activations that the patches need (hooks)."""
    caps = [LayerCapture() for _ in layers]
    handles = []

    def keep(cap: LayerCapture, attr: str):
        def pre_hook(_module, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            setattr(cap, attr, x[0, -1].detach().clone())

        return pre_hook

    def keep_output(cap: LayerCapture):
        def hook(_module, _args, _kwargs, output):
            out = output[0] if isinstance(output, tuple) else output
            cap.x_out = out[0, -1].detach().clone()

        return hook

    for layer, cap in zip(layers, caps, strict=True):
        handles += [
            layer.register_forward_pre_hook(keep(cap, "x_in"), with_kwargs=True),
            layer.pre_feedforward_layernorm.register_forward_pre_hook(keep(cap, "v_c")),
            layer.mlp.down_proj.register_forward_pre_hook(keep(cap, "h_gated_c")),
            layer.post_feedforward_layernorm.register_forward_pre_hook(keep(cap, "d_c")),
            layer.register_forward_hook(keep_output(cap), with_kwargs=True),
        ]
    try:
        yield caps
    finally:
        for h in handles:
            h.remove()


def attention_residual(layer: nn.Module, x: Tensor, position_embeddings: tuple[Tensor, Tensor]) -> Tensor:
    """v = A(∅, x): the first half of Gemma3DecoderLayer.forward for the token x alone, (1, 1, d)."""
    h = layer.input_layernorm(x)
    a, _ = layer.self_attn(hidden_states=h, position_embeddings=position_embeddings, attention_mask=None)
    return x + layer.post_attention_layernorm(a)


# -- patched weights in reusable buffers ---------------------------------------------------------------
def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class PatchBuffers:
    """Storage for one layer's patched tensors, in the model's dtype, reused layer after layer."""

    dtype: torch.dtype
    tensors: dict[str, Tensor] = field(default_factory=dict)
    _scratch: dict[tuple, Tensor] = field(default_factory=dict)

    def out(self, name: str, like: Tensor) -> Tensor:
        t = self.tensors.get(name)
        if t is None or t.shape != like.shape or t.device != like.device:
            t = self.tensors[name] = torch.empty(like.shape, dtype=self.dtype, device=like.device)
        return t

    def scratch(self, like: Tensor, dtype: torch.dtype) -> Tensor:
        key = (tuple(like.shape), dtype, like.device)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return self._scratch[key]


def add_rank1_rounded(W: Tensor, u: Tensor, s: Tensor, out: Tensor) -> None:
    """out = W + u sᵀ rounded once to out's dtype. W is in the compute dtype; when that is not the
    model's dtype, W is a scratch copy and is overwritten."""
    if W.dtype == out.dtype:
        torch.addr(W, u, s, out=out)
    else:
        out.copy_(W.addr_(u, s))  # one rounding, as when the patched checkpoint is saved in its dtype


def in_compute_dtype(W: Tensor, bufs: PatchBuffers, cdt: torch.dtype) -> Tensor:
    """W itself when it is already in the compute dtype, else an exact copy in a reused scratch buffer."""
    return W if W.dtype == cdt else bufs.scratch(W, cdt).copy_(W)


@dataclass
class LayerPatchStats:
    div_zero: int = 0  # coordinates where Eq. 4's (or App. B's) division was undefined
    no_root: int = 0  # 1 when App. B's multiplier equation had no root on (−∞, min m²)
    dm_linf: float = 0.0  # max |Δm|: large where the naive division meets small f_C


def patch_layer(layer: nn.Module, cap: LayerCapture, v: Tensor, variant: str,
                bufs: PatchBuffers) -> LayerPatchStats:
    """Fill `bufs` with this layer's patched W_gate, W_up, m (and W_down for `stable`).

    `v` is A(∅, x) for the layer's Algorithm-1 input x = cap.x_in (see `attention_residual`).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
    mlp, post = layer.mlp, layer.post_feedforward_layernorm
    dtype = mlp.gate_proj.weight.dtype
    cdt = compute_dtype(dtype)
    z_c = layer.pre_feedforward_layernorm(cap.v_c).to(cdt)
    z = layer.pre_feedforward_layernorm(v.reshape(-1)).to(cdt)
    for name, lin in ((GATE, mlp.gate_proj), (UP, mlp.up_proj)):  # Eqs. 2–3
        W = in_compute_dtype(lin.weight, bufs, cdt)
        u, s = input_patch_factors(W, z_c, z)
        add_rank1_rounded(W, u, s, bufs.out(name, lin.weight))

    stats = LayerPatchStats()
    w_post = post.weight.to(cdt)
    v_c, v_ = cap.v_c.to(cdt), v.reshape(-1).to(cdt)
    if variant == "naive":
        bufs.tensors.pop(DOWN, None)  # W_down stays the model's own
        f_c = rms_normalize(post, cap.d_c).to(cdt)
        dm, stats.div_zero = scale_patch(v_c, v_, f_c)  # Eq. 4
    else:
        dm, stats.div_zero, stats.no_root = _stable_down_and_scale(layer, cap, v_c - v_, bufs, cdt)
    bufs.out(SCALE, post.weight).copy_(w_post + dm)
    stats.dm_linf = float(dm.abs().max())
    return stats


def _stable_down_and_scale(layer: nn.Module, cap: LayerCapture, dv: Tensor, bufs: PatchBuffers,
                           cdt: torch.dtype) -> tuple[Tensor, int, int]:
    """App. B.1 steps 1–3: W_down's rank-1 patch from the RMSNorm inversion, then Δm for the remainder."""
    post, W = layer.post_feedforward_layernorm, layer.mlp.down_proj.weight
    m = 1.0 + post.weight.double()
    f_c = rms_normalize(post, cap.d_c).double()
    g = dv.double() + m * f_c  # target of m ⊙ Norm(·): (v_C − v) + h_out,C
    d_c = cap.d_c.double()
    target_rms = float(d_c.square().mean().sqrt())
    h_target, no_root = invert_rms_norm(g, m, target_rms)  # step 1
    h_gated = cap.h_gated_c.to(cdt)
    delta = (h_target - d_c).to(cdt)
    out = bufs.out(DOWN, W)  # step 2: ΔW_down = δ h_gated,Cᵀ / ‖h_gated,C‖²
    add_rank1_rounded(in_compute_dtype(W, bufs, cdt), delta, h_gated / h_gated.square().sum(), out)
    # step 3: the remainder, against what the rounded W_down really outputs for h_gated,C
    h_down = nn.functional.linear(cap.h_gated_c, out)
    f_new = rms_normalize(post, h_down).double()
    dm, div_zero = divide_or_zero(g - m * f_new, f_new)
    return dm.to(cdt), div_zero, int(no_root)


def patched_layer_forward(layer: nn.Module, bufs: PatchBuffers, hidden: Tensor,
                          position_embeddings: tuple[Tensor, Tensor]) -> Tensor:
    """The decoder layer's own forward on the token alone, with the patched tensors in `bufs`."""
    return functional_call(layer, bufs.tensors, (hidden,),
                           {"position_embeddings": position_embeddings, "attention_mask": None})
