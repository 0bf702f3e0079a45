"""Attention scores at initialization (Karbevski & Mijoski App. 8.1), sampled and in closed form.

Row-vector convention (as in the paper's main text): a token is a row x ∈ R^{d_model}; head i's query
is x W_Q^i (baseline) or the coordinate slice x[i·d_k:(i+1)·d_k] (W_Q = I); its key is x W_K^i.
"Score" means the raw dot product q·k, before the 1/√d_k (or 1/(2√d_k)) factor, as in App. 8.1.
"""

from __future__ import annotations

import math

import torch


def head_scores(x: torch.Tensor, w_q: torch.Tensor | None, w_k: torch.Tensor, heads: int) -> torch.Tensor:
    """Raw scores q_i·k_i of every token pair, per head: x (B, T, d) -> (B, heads, T, T).

    `w_q=None` is the reduced architecture: each head's query is its coordinate slice of x.
    """
    batch, tokens, d = x.shape
    d_k = d // heads
    q = x if w_q is None else x @ w_q
    k = x @ w_k
    q = q.view(batch, tokens, heads, d_k).transpose(1, 2)
    k = k.view(batch, tokens, heads, d_k).transpose(1, 2)
    return q @ k.transpose(-1, -2)


def closed_form_std(sigma: float, d_model: int, heads: int, sq_norm: float = 1.0) -> tuple[float, float]:
    """App. 8.1's derivation, for rows of squared norm `sq_norm` (the paper takes 1):

    baseline  Std(q·k) = σ² ‖x‖² √d_k   (two independent N(0, σ²‖x‖²) vectors of length d_k)
    W_Q = I   Std(q·k) = σ ‖x‖² / √h    (‖q_i‖² = ‖x‖²/h on average, k ~ N(0, σ²‖x‖²))
    Their ratio, 1/(σ√d_model), does not depend on ‖x‖ nor on how d_model splits into heads.
    """
    d_k = d_model // heads
    return sigma**2 * sq_norm * math.sqrt(d_k), sigma * sq_norm / math.sqrt(heads)


def unit_norm_rows(batch: int, tokens: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """Isotropic rows with ‖x‖ = 1 exactly: the paper's assumption about LayerNorm outputs."""
    x = torch.randn(batch, tokens, d, generator=generator)
    return x / x.norm(dim=-1, keepdim=True)


def layernorm_rows(batch: int, tokens: int, d: int, generator: torch.Generator, embedding_std: float,
                   eps: float) -> torch.Tensor:
    """What ln_1 of a freshly initialized nanoGPT really emits in the first block: LayerNorm (unit
    weight, no bias) of token + position embeddings, each N(0, embedding_std²). Rows have
    ‖x‖² = d·s²/(s² + eps) ≈ d, not 1."""
    y = torch.randn(batch, tokens, d, generator=generator) * embedding_std
    y = y + torch.randn(batch, tokens, d, generator=generator) * embedding_std
    return torch.nn.functional.layer_norm(y, (d,), eps=eps)
