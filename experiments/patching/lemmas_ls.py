"""Table 1's lemmas at k positions at once: their least-squares, rank-≤k versions (the fixed patch,
fixed_patch.py, whose docstring derives them). Plain float64 tensors, rows are positions; with k = 1 each
is its rank-1 lemma of lemmas.py. Each rule's `fit_positions` (patching/rules/) calls its own."""

from __future__ import annotations

import torch
from torch import Tensor


def input_update_ls(W: Tensor, Z_c: Tensor, Z: Tensor) -> Tensor:
    """ΔW = W (Z_C − Z)ᵀ (Zᵀ)⁺ for W (..., out, in) (batched over experts), Z, Z_C (k, in): (W + ΔW) z_i =
    W z_C,i at every row i whose z_i is independent of the others."""
    return (W @ (Z_c - Z).T) @ torch.linalg.pinv(Z.T)


def outer_weight_ls(R: Tensor, Y: Tensor) -> Tensor:
    """ΔW′ = Rᵀ (Yᵀ)⁺ (out, n): ΔW′ y_i = r_i for independent rows y_i of Y (k, n)."""
    return R.T @ torch.linalg.pinv(Y.T)


def outer_bias_ls(R: Tensor) -> Tensor:
    """The one Δb closest to every row of R (k, d) in least squares: their mean."""
    return R.mean(0)


def scale_ls(R: Tensor, H: Tensor) -> Tensor:
    """Δm minimising Σ_i ‖h_i ⊙ Δm − r_i‖², coordinate by coordinate; 0 where every h_ij is 0 (Lemma 10:
    such a coordinate cannot be moved by a scale)."""
    den = H.square().sum(0)
    return torch.where(den > 0, (H * R).sum(0) / torch.where(den > 0, den, torch.ones_like(den)), 0.0)


def moe_features(ys: Tensor, weights: Tensor) -> Tensor:
    """Φ (k, E·n) from every expert's outer input y_ie (k, E, n) and router weights a_ie (k, E), 0 for an
    expert that position i did not pick."""
    return (weights.unsqueeze(-1) * ys).reshape(ys.shape[0], -1)


def moe_ls(R: Tensor, Phi: Tensor, experts: int) -> Tensor:
    """ΔW′_e for every expert (E, d, n): Σ_e a_ie ΔW′_e y_ie = r_i for independent rows of Φ."""
    stacked = R.T @ torch.linalg.pinv(Phi.T)  # (d, E·n)
    return stacked.reshape(R.shape[1], experts, -1).permute(1, 0, 2)


def ridge_ls(B: Tensor, X: Tensor, ridge: float) -> Tensor:
    """Δ with Δ Xᵀ ≈ B, for B (..., out, N) and rows X (N, n): B (X Xᵀ + λ I)⁻¹ X, λ = ridge · mean_i ‖x_i‖²
    (scale-free); at ridge = 0 the least-squares lemma's B (Xᵀ)⁺."""
    if ridge == 0:
        return B @ torch.linalg.pinv(X.T)
    lam = ridge * float(X.square().sum(-1).mean())
    gram = X @ X.T + lam * torch.eye(X.shape[0], dtype=X.dtype, device=X.device)
    return B @ torch.linalg.solve(gram, X)


def truncate(delta: Tensor, rank: int | None) -> Tensor:
    """The best rank-`rank` approximation of a matrix (batched over leading dims), or `delta` itself."""
    if rank is None or min(delta.shape[-2:]) <= rank:
        return delta
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    return (U[..., :rank] * S[..., None, :rank]) @ Vh[..., :rank, :]


def relative_residual(R: Tensor, fitted: Tensor) -> float:
    """‖R − fitted‖_F / ‖R‖_F (0 when R = 0)."""
    norm = float(R.norm())
    return float((R - fitted).norm()) / norm if norm > 0 else 0.0


