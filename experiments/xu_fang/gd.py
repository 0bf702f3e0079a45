"""§4: in-context linear regression read by selector heads (Cor. 4.1, Eq. 3, Prop. 4.4).

Tokens are x_j = (u_j, w_j) ∈ R^{d_u + d_w}; the query is (u_t, 0). The selectors S_u = [I 0] and
S_w = [0 I] make the key and query read the covariate and the value read the target, so Thm 3.4's
readout Θ_V Σ Θ_Kᵀ Θ_Q x_t becomes Σ_wu u_t: one step of population gradient descent from B = 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from experiments.xu_fang.attention import causal_head, prefix_head, prefix_readout, project


def selectors(d_u: int, d_w: int, dtype: torch.dtype = torch.float64, device=None) -> tuple[Tensor, Tensor]:
    """S_u = [I_{d_u} 0] and S_w = [0 I_{d_w}]."""
    eye = torch.eye(d_u + d_w, dtype=dtype, device=device)
    return eye[:d_u], eye[d_u:]


def prompt_tokens(u: Tensor, w: Tensor, u_query: Tensor) -> tuple[Tensor, Tensor]:
    """Demonstration tokens (u_j, w_j) (B, N, d) and the query token (u_t, 0) (B, d)."""
    return torch.cat([u, w], dim=-1), torch.cat([u_query, torch.zeros_like(w[:, 0])], dim=-1)


def single_head_predictions(context: Tensor, query: Tensor, theta_q: Tensor, theta_k: Tensor,
                            theta_v: Tensor) -> Tensor:
    """√d_k · y_t at the query after every prefix length n = 1..N (App. B.2): the √d_k cancels the
    Gaussian γ_Σ = 1/√d_k so that the head's output is on the scale of Σ_wu u_t. (B, N, d_v)."""
    return prefix_head(context, query, theta_q, theta_k, theta_v) * math.sqrt(theta_q.shape[-2])


def residual_stack_predictions(u: Tensor, w: Tensor, u_query: Tensor, eta: float, layers: int) -> Tensor:
    """The K-block residual stack of Eq. 3 as run in App. B.2, read at the query after every prefix.

    Hidden states (u_j, r_j^(k)) with r_j^(0) = w_j and r_query^(0) = 0. Block k applies the selector
    head (Θ_Q = Θ_K = S_u, Θ_V = S_w) causally and updates every target slot by
    r^(k+1) = r^(k) − η √d_u y^(k) (Θ_V = η S_wᵀS_w and W_MLP = −S_wᵀS_w of Eq. 3, with App. B.2's √d_u).
    The demonstrations never see the query, so their residuals are shared by all prompt lengths;
    the query's own residual differs per prompt length and is carried as (B, N, d_w).
    Returns ŵ^(k) = −r_query^(k) for k = 0..K: (K+1, B, N, d_w).
    """
    d_u, d_w = u.shape[-1], w.shape[-1]
    s_u, s_w = selectors(d_u, d_w, u.dtype, u.device)
    scale = eta * math.sqrt(d_u)
    hidden = torch.cat([u, w], dim=-1)  # demonstration tokens, causal among themselves
    query_scores = (u * u_query.unsqueeze(-2)).sum(-1) / math.sqrt(d_u)  # q = k = u: fixed across blocks
    self_score = (u_query * u_query).sum(-1) / math.sqrt(d_u)
    r_query = torch.zeros(*w.shape[:-1], d_w, dtype=w.dtype, device=w.device)  # one per prompt length
    out = [-r_query]
    for _ in range(layers):
        y_demos = causal_head(hidden, s_u, s_u, s_w)
        y_query = prefix_readout(query_scores, project(hidden, s_w), self_score, r_query).to(w.dtype)
        hidden = torch.cat([u, hidden[..., d_u:] - scale * y_demos], dim=-1)
        r_query = r_query - scale * y_query
        out.append(-r_query)
    return torch.stack(out)


def population_gd_iterates(sigma_uu: Tensor, sigma_wu: Tensor, eta: float, steps: int) -> Tensor:
    """B^(0) = 0, B^(k+1) = B^(k) − η (B^(k) Σ_uu − Σ_wu): gradient descent on L(B) = ½E‖w − Bu‖².
    Returns (steps+1, ..., d_w, d_u)."""
    b = torch.zeros_like(sigma_wu)
    out = [b]
    for _ in range(steps):
        b = b - eta * (b @ sigma_uu - sigma_wu)
        out.append(b)
    return torch.stack(out)
