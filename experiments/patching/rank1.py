"""The rank-1 context patch of Dherin et al.

A contextual block is Φ_W(C, x) = φ_W(A(C, x)) with φ_W(z) = f(Wz + b). Removing the context
portion Y changes A's output by the context vector δA = A(C, x) − A(C∖Y, x); Theorem 2.2 moves
that change into the first MLP matrix:

    ΔW = (W δA) A(C∖Y, x)ᵀ / ‖A(C∖Y, x)‖²                                   (Eq. 1, Eq. 2)

because ΔW A(C∖Y, x) = W δA. With a skip connection around the MLP
(Φ = A + W′g(WA + b) + b′, Theorem B.2) the same ΔW plus Δb′ = δA does it.

Everything here is batched over leading dimensions: `a_full` and `a_reduced` are (..., n), W is
(m, n) or (..., m, n), and the patches come out (..., m, n) and (..., n).
"""

from __future__ import annotations

from torch import Tensor


def context_vector(a_full: Tensor, a_reduced: Tensor) -> Tensor:
    """δA = A(C, x) − A(C∖Y, x)."""
    return a_full - a_reduced


def rank1_update(W: Tensor, delta_a: Tensor, a_reduced: Tensor) -> Tensor:
    """ΔW = (W δA) a_reducedᵀ / ‖a_reduced‖² (Theorem 2.2). Needs a_reduced ≠ 0."""
    sq_norm = a_reduced.pow(2).sum(-1)
    if bool((sq_norm == 0).any()):
        raise ValueError("A(C∖Y, x) = 0: the rank-1 patch is undefined (Theorem 2.2 needs it nonzero)")
    w_delta = (W @ delta_a.unsqueeze(-1)).squeeze(-1)  # (..., m)
    return w_delta.unsqueeze(-1) * (a_reduced / sq_norm.unsqueeze(-1)).unsqueeze(-2)


def context_patch(W: Tensor, a_full: Tensor, a_reduced: Tensor) -> Tensor:
    """ΔW that makes φ_{W+ΔW}(A(C∖Y, x)) = φ_W(A(C, x)) for an MLP without skip (Cor. 2.5.1)."""
    return rank1_update(W, context_vector(a_full, a_reduced), a_reduced)


def context_patch_skip(W: Tensor, a_full: Tensor, a_reduced: Tensor) -> tuple[Tensor, Tensor]:
    """(ΔW, Δb′) for an MLP with skip connection (Theorem B.2): Δb′ = δA, ΔW as above."""
    delta_a = context_vector(a_full, a_reduced)
    return rank1_update(W, delta_a, a_reduced), delta_a
