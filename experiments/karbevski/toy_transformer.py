"""A small, explicit decoder-only transformer as pure functions of a weight dict (row-vector
convention, as in Karbevski & Mijoski §3-4), so an original model and its reparametrized copy run
the same genuine forward pass, with only the weights changed.

Weights: {"E": (V, d) token embedding, "E_P": (n, d) positions, "head": (d, V) or None when tied
to E (logits = X Eᵀ), "layers": [layer, ...]} with layer = {"W_Q": (d, d) or None (= I_d: the query
is the input itself, no parameter), "W_K", "W_V", "W_O": (d, d), "W_up": (d, f), "W_down": (f, d)}.
A weight-shared model lists the same layer dict L times.

Architectures (`Arch`): skip connections around attention and MLP ("both", the standard block) or
around attention only ("attention", Thm 4.2); no normalization, or pre-LayerNorm (the case the
theorems exclude, App. 8.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SKIPS = ("both", "attention")
NORMS = ("none", "layernorm")


@dataclass(frozen=True)
class Arch:
    heads: int
    skips: str = "both"  # "both" | "attention"
    norm: str = "none"  # "none" | "layernorm" (pre-LN, no affine)
    causal: bool = True
    ln_eps: float = 1e-5


def attention_core(x: torch.Tensor, w_q: torch.Tensor | None, w_k: torch.Tensor, w_v: torch.Tensor, heads: int,
                   causal: bool = True) -> torch.Tensor:
    """S_c(X, W_Q, W_K, W_V) of §3.1: per-head softmax(q_i k_iᵀ/√d_k + M) v_i, heads concatenated.
    x: (B, n, d). `w_q=None` means W_Q = I_d."""
    batch, n, d = x.shape
    d_k = d // heads
    q = x if w_q is None else x @ w_q

    def split(t):
        return t.view(batch, n, heads, d_k).transpose(1, 2)

    scores = split(q) @ split(x @ w_k).transpose(-1, -2) / math.sqrt(d_k)
    if causal:
        mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    out = scores.softmax(-1) @ split(x @ w_v)
    return out.transpose(1, 2).reshape(batch, n, d)


def attention(x: torch.Tensor, layer: dict, arch: Arch) -> torch.Tensor:
    return attention_core(x, layer["W_Q"], layer["W_K"], layer["W_V"], arch.heads, arch.causal) @ layer["W_O"]


def mlp(x: torch.Tensor, layer: dict) -> torch.Tensor:
    return F.gelu(x @ layer["W_up"]) @ layer["W_down"]


def _norm(x: torch.Tensor, arch: Arch) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=arch.ln_eps) if arch.norm == "layernorm" else x


def block(x: torch.Tensor, layer: dict, arch: Arch) -> torch.Tensor:
    y = x + attention(_norm(x, arch), layer, arch)
    if arch.skips == "both":
        return y + mlp(_norm(y, arch), layer)
    return mlp(_norm(y, arch), layer)


def forward(tokens: torch.Tensor, weights: dict, arch: Arch) -> torch.Tensor:
    """Logits (B, n, V) for token ids (B, n)."""
    x = weights["E"][tokens] + weights["E_P"][: tokens.shape[1]]
    for layer in weights["layers"]:
        x = block(x, layer, arch)
    head = weights["E"].T if weights["head"] is None else weights["head"]
    return x @ head


def random_weights(vocab: int, d: int, d_ff: int, layers: int, max_len: int, generator: torch.Generator,
                   shared: bool = False, tied: bool = False, dtype=torch.float64) -> dict:
    """Gaussian weights scaled 1/√fan_in, so activations stay O(1) through the layers."""

    def g(*shape, fan_in):
        return torch.randn(*shape, generator=generator, dtype=dtype) / math.sqrt(fan_in)

    def layer():
        return {"W_Q": g(d, d, fan_in=d), "W_K": g(d, d, fan_in=d), "W_V": g(d, d, fan_in=d),
                "W_O": g(d, d, fan_in=d), "W_up": g(d, d_ff, fan_in=d), "W_down": g(d_ff, d, fan_in=d_ff)}

    stack = [layer()] * layers if shared else [layer() for _ in range(layers)]
    return {"E": g(vocab, d, fan_in=1), "E_P": g(max_len, d, fan_in=1),
            "head": None if tied else g(d, vocab, fan_in=d), "layers": stack}


ATTENTION_KEYS = ("W_Q", "W_K", "W_V", "W_O")


def parameter_counts(weights: dict) -> dict[str, int]:
    """Parameters actually stored: shared layers and a tied head counted once, W_Q = None as zero."""
    unique = list({id(layer): layer for layer in weights["layers"]}.values())
    attn = sum(layer[k].numel() for layer in unique for k in ATTENTION_KEYS if layer[k] is not None)
    mlp_params = sum(layer[k].numel() for layer in unique for k in ("W_up", "W_down"))
    embed = weights["E"].numel() + weights["E_P"].numel() + (0 if weights["head"] is None else weights["head"].numel())
    return {"attention": attn, "mlp": mlp_params, "embedding": embed, "total": attn + mlp_params + embed}
