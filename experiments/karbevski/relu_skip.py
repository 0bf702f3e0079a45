"""When a skip connection can be absorbed into a ReLU MLP (Karbevski & Mijoski App. 8.4: Thm 8.3,
Lemma 8.4, Cor. 8.4.1). Column-vector maths batched as rows: x (n, h), W₁ (m, h), W₂ (h, m).

Thm 8.3: W₂ReLU(W₁x) + x = V₂ReLU(V₁x) for all x has a solution iff W₂[:, J]W₁[J, :] = −I_h for some
J with |J| ≥ h; then V₁ = (I − 2Π_J)W₁, V₂ = W₂.
"""

from __future__ import annotations

import itertools

import torch


def skip_relu_mlp(x, w1, w2):
    return torch.relu(x @ w1.T) @ w2.T + x


def relu_mlp(x, v1, v2):
    return torch.relu(x @ v1.T) @ v2.T


def absorbable_pair(h: int, m: int, j_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(W₁, W₂, J) meeting Thm 8.3's condition: W₁ Gaussian (rows pairwise non-collinear almost
    surely), W₂[:, J] = −pinv(W₁[J, :]) so that W₂[:, J]W₁[J, :] = −I_h, the other columns Gaussian."""
    assert h <= j_size <= m
    w1 = torch.randn(m, h, generator=generator, dtype=torch.float64)
    w2 = torch.randn(h, m, generator=generator, dtype=torch.float64)
    j = list(range(j_size))
    w2[:, j] = -torch.linalg.pinv(w1[j])
    return w1, w2, j


def condition_residual(w1, w2, j) -> float:
    """max |W₂[:, J]W₁[J, :] + I_h|: zero when Thm 8.3's condition holds."""
    return (w2[:, j] @ w1[j] + torch.eye(w1.shape[1], dtype=w1.dtype)).abs().max().item()


def absorb_skip(w1, w2, j):
    """Thm 8.3 (sufficiency): V₁ = D W₁ with D = I − 2Π_J, V₂ = W₂."""
    signs = torch.ones(w1.shape[0], dtype=w1.dtype)
    signs[j] = -1
    return signs[:, None] * w1, w2.clone()


def abs_features_conditioning(w1, x) -> float:
    """Lemma 8.4: the functions |w_iᵀx| are linearly independent when the rows are pairwise
    non-collinear. Measured as the smallest singular value of the sampled feature matrix with
    unit-norm columns (0 if dependent)."""
    feats = (x @ w1.T).abs()
    feats = feats / feats.norm(dim=0, keepdim=True)
    return torch.linalg.svdvals(feats)[-1].item()


def best_kink_aligned_fit(w1, w2, x) -> dict:
    """Cor. 8.4.1, measured: the best least-squares fit of g(x) = W₂ReLU(W₁x) + x by V₂ReLU(V₁x) over
    every V₁ whose kinks are W₁'s (V₁ = diag(s)W₁, s ∈ {±1}^m: positive scales and row order are
    absorbed by V₂) and every V₂ (linear least squares). Thm 8.3's proof shows an exact V₁ must
    have this form; the returned relative residual is 0 (rounding) iff some pattern fits."""
    target = skip_relu_mlp(x, w1, w2)
    pos, neg = torch.relu(x @ w1.T), torch.relu(-(x @ w1.T))
    best = {"relative_residual": float("inf"), "signs": None}
    for signs in itertools.product((1, -1), repeat=w1.shape[0]):
        feats = torch.where(torch.tensor(signs) > 0, pos, neg)
        v2t = torch.linalg.lstsq(feats, target).solution
        rel = ((feats @ v2t - target).norm() / target.norm()).item()
        if rel < best["relative_residual"]:
            best = {"relative_residual": rel, "signs": signs}
    return best
