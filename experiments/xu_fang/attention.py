"""The frozen single-head causal softmax attention of §3.1 and the target it is read against.

    q_t = Θ_Q x_t,  k_j = Θ_K x_j,  v_j = Θ_V x_j,  y_t = Σ_{j≤t} softmax_j(q_tᵀk_j / √d_k) v_j

Tokens are rows, so a projection Θ (d_out × d) acts as x @ Θᵀ. Parameters may carry leading batch
dimensions (one head per seed), broadcast against the stream's batch dimension.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def project(x: Tensor, theta: Tensor) -> Tensor:
    """Θ x for every token: (..., T, d) with Θ (..., d_out, d) -> (..., T, d_out)."""
    return x @ theta.transpose(-1, -2)


def causal_head(x: Tensor, theta_q: Tensor, theta_k: Tensor, theta_v: Tensor) -> Tensor:
    """y_t for every position t of every stream: (..., T, d_v), by torch's fused attention.

    The fused (flash) CPU kernel wants q, k, v of one width and is ~10x faster than the fallback,
    so the narrower side is zero-padded: zero query/key columns add nothing to qᵀk, zero value
    columns give output columns that are dropped. The scale stays 1/√d_k of the real key width.
    """
    q, k, v = project(x, theta_q), project(x, theta_k), project(x, theta_v)
    d_k, d_v = q.shape[-1], v.shape[-1]
    width = max(d_k, d_v)
    q, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
    # (..., T, E) -> (1, batch, T, E): the fused kernel takes 4-d (batch, heads, T, E) inputs only.
    lead = q.shape[:-2]
    q, k, v = (t.reshape(1, -1, *t.shape[-2:]) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=d_k**-0.5)
    return y.reshape(*lead, *y.shape[-2:])[..., :d_v]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Running sums in at least float32 (as fused attention kernels accumulate), float64 kept."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def prefix_readout(scores: Tensor, values: Tensor, self_score: Tensor | None = None,
                   self_value: Tensor | None = None) -> Tensor:
    """One query read against every prefix of a context, all prefix lengths at once.

    scores (B, N): the query's logits s_j = qᵀk_j/√d_k for context tokens j = 1..N; values (B, N, d_v).
    Row n-1 of the result is the softmax average over tokens 1..n plus, if given, the query token
    itself (logit self_score (B,), value self_value (B, d_v) or one per prefix (B, N, d_v)), which a
    causal head always attends to. Cumulative sums make this O(N) instead of N separate prompts.
    """
    acc = accumulation_dtype(values.dtype)
    scores, values = scores.to(acc), values.to(acc)
    shift = scores.amax(dim=-1)
    if self_score is not None:
        shift = torch.maximum(shift, self_score.to(acc))
    weights = torch.exp(scores - shift.unsqueeze(-1))  # a common factor: cancels in the ratio
    numerator = torch.cumsum(weights.unsqueeze(-1) * values, dim=-2)
    denominator = torch.cumsum(weights, dim=-1)
    if self_score is not None:
        w_self = torch.exp(self_score.to(acc) - shift)
        denominator = denominator + w_self.unsqueeze(-1)
        if self_value is not None:
            sv = self_value.to(acc)
            sv = sv.unsqueeze(-2) if sv.dim() == values.dim() - 1 else sv
            numerator = numerator + w_self[..., None, None] * sv
    return numerator / denominator.unsqueeze(-1)


def tilted_prefix_means(x: Tensor, tilt: Tensor) -> Tensor:
    """X̄_n(q) of Eq. (1) for n = 1..T: the e^{tiltᵀx_j}-weighted mean of x_1..x_n, with
    tilt = Θ_Kᵀ q / √d_k per stream. x (B, T, d), tilt (B, d) -> (B, T, d)."""
    return prefix_readout((x * tilt.unsqueeze(-2)).sum(-1), x)


def readout_matrix(theta_q: Tensor, theta_k: Tensor, theta_v: Tensor, sigma: Tensor) -> Tensor:
    """Θ_V Σ Θ_Kᵀ Θ_Q, the covariance readout of Thm 3.4 (d_v × d)."""
    return theta_v @ sigma @ theta_k.transpose(-1, -2) @ theta_q


def cosine(a: Tensor, b: Tensor, eps: float = 1e-30) -> Tensor:
    """cos(a, b) along the last dimension, computed in float64."""
    a, b = a.double(), b.double()
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)


def prefix_head(context: Tensor, query: Tensor, theta_q: Tensor, theta_k: Tensor, theta_v: Tensor) -> Tensor:
    """The causal head's output at a query token placed after every prefix of `context`.

    context (B, N, d), query (B, d) -> (B, N, d_v): row n-1 is y at the query of the prompt
    (x_1, ..., x_n, x_query). Same head as `causal_head`, evaluated for N prompt lengths in one pass.
    """
    d_k = theta_q.shape[-2]
    q = project(query.unsqueeze(-2), theta_q)  # (B, 1, d_k)
    scores = (project(context, theta_k) * q).sum(-1) / d_k**0.5
    self_score = (project(query.unsqueeze(-2), theta_k) * q).sum(-1).squeeze(-1) / d_k**0.5
    self_value = project(query.unsqueeze(-2), theta_v).squeeze(-2)
    return prefix_readout(scores, project(context, theta_v), self_score, self_value)
