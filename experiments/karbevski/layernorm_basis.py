"""A basis change through LayerNorm (Karbevski & Mijoski App. 8.2: Lemma 8.1, Thm 8.2, Remarks 5, 7).

Column-vector maths, batched as rows: x is (n, d), a matrix M acts as x ↦ x Mᵀ. L_ε is LayerNorm
without affine parameters (population variance, as torch's layer_norm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from experiments.karbevski.reparam import require_gl


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def layer_norm_inverse(z: torch.Tensor, eps: float) -> torch.Tensor:
    """The zero-mean pre-image of z ∈ B = {z ∈ H : ‖z‖ < √d}: √(dε/(d − ‖z‖²)) z (Lemma 8.1, step 2)."""
    d = z.shape[-1]
    sq = z.pow(2).sum(-1, keepdim=True)
    return torch.sqrt(d * eps / (d - sq)) * z


def zero_mean_basis(d: int, dtype=torch.float64) -> torch.Tensor:
    """Q (d, d−1): an orthonormal basis of H = {z : 1ᵀz = 0}."""
    ones = torch.ones(d, 1, dtype=dtype)
    q, _ = torch.linalg.qr(torch.cat([ones, torch.eye(d, dtype=dtype)[:, : d - 1]], dim=1))
    return q[:, 1:]


def semi_conjugacy_matrix(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lemma 8.1, step 1: M₀ = λ₀ Diag(v) A with v = A⁻ᵀ1/‖A⁻ᵀ1‖ (so M₀ maps H into H) and λ₀ making
    ‖M₀|_H‖₂ = 1 (so M₀ maps LayerNorm's image ball into itself). Returns (M₀, D̃ = λ₀ Diag(v))."""
    require_gl(a, "A = ΘD")
    d = a.shape[0]
    v = torch.linalg.solve(a.T, torch.ones(d, dtype=a.dtype))
    v = v / v.norm()
    q = zero_mean_basis(d, a.dtype)
    lam = 1 / torch.linalg.matrix_norm(q.T @ (v[:, None] * a) @ q, ord=2)
    d_tilde = torch.diag(lam * v)
    return d_tilde @ a, d_tilde


def semi_conjugate(x: torch.Tensor, m0: torch.Tensor, eps: float, shift: torch.Tensor | None = None) -> torch.Tensor:
    """f(x) = L_ε⁻¹(M₀ L_ε(x)) + h(x)1, the function of Lemma 8.1 (`shift` = h(x), one value per row)."""
    f = layer_norm_inverse(layer_norm(x, eps) @ m0.T, eps)
    return f if shift is None else f + shift[:, None]


def thm82_mlp_prime(x: torch.Tensor, mlp, m0: torch.Tensor, eps: float, shift: torch.Tensor | None = None):
    """Thm 8.2, Eq. 7: MLP′(x) = L_ε⁻¹(M₀ L_ε(x + MLP(x))) − x + h(x)1."""
    return semi_conjugate(x + mlp(x), m0, eps, shift) - x


def linearity_deviation(d: int, samples: int, generator: torch.Generator, eps: float, scale: float) -> dict:
    """Remark 5: how far f_M(x) = L_ε⁻¹(M L_ε(x)) is from linear, for M = M₀ of a random A with
    i.i.d. N(0, 1/d) entries and Gaussian inputs x ~ N(0, scale² I).

    The best linear map B is fitted by least squares on `samples` inputs; the deviation is the
    relative residual ‖f(x) − xB‖/‖f(x)‖ on as many fresh inputs. Also returned: the coefficient of
    variation of the scalar √(dε/(d − ‖M L(x)‖²)) that makes f non-linear."""
    a = torch.randn(d, d, generator=generator, dtype=torch.float64) / d**0.5
    m0, _ = semi_conjugacy_matrix(a)
    fit_x = torch.randn(samples, d, generator=generator, dtype=torch.float64) * scale
    test_x = torch.randn(samples, d, generator=generator, dtype=torch.float64) * scale
    b = torch.linalg.lstsq(fit_x, semi_conjugate(fit_x, m0, eps)).solution
    f_test = semi_conjugate(test_x, m0, eps)
    residual = (f_test - test_x @ b).norm() / f_test.norm()
    z = layer_norm(test_x, eps) @ m0.T
    coefficient = torch.sqrt(d * eps / (d - z.pow(2).sum(-1)))
    return {"deviation": residual.item(), "coefficient_cv": (coefficient.std() / coefficient.mean()).item()}
