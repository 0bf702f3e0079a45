"""The implicit weight dynamics of ICL (Dherin et al. §3 and App. E), as pure functions.

Feeding a contextual block Φ_W = φ_W ∘ A the context C = [c_1, ..., c_n] one token at a time gives
a sequence of first-MLP-layer weights. Two such sequences are in the paper:

§3 (Eqs. 6–9, Prop. 3.1): W_i = W_0 + ΔW(C_i) with C_i = [c_1..c_i], the Cor. 2.5.1 patch of the
    prefix, so that Φ_{W_i}(x) = Φ_{W_0}(C_i, x). Its steps are gradient steps
    W_{i+1} = W_i − h ∇_W trace(Δ_iᵀ W),  h = 1/‖A(x)‖²,  Δ_i = W_0 (A(C_i,x) − A(C_{i+1},x)) A(x)ᵀ.

App. E (Eqs. 27–31): W_i = W_{i-1} + (W_{i-1} ΔA(c_i)) S_iᵀ / ‖S_i‖² with S_i = A(c_{i+1}..c_n, x)
    and ΔA(c_i) = S_{i-1} − S_i, so that Φ_{W_i}(c_{i+1}..c_n, x) = Φ_{W_0}(c_1..c_n, x) (Eq. 28), and
    W_n = W_0 (I + h_1 A_1) ⋯ (I + h_n A_n),  A_i = ΔA(c_i) S_iᵀ, h_i = 1/‖S_i‖² (Eqs. 29–31).

Everything works for any contextual layer that maps token rows (B, T, d_in) to (B, T, d_in) and
reads causally (attention with a causal mask, an RNN, ...): the functions only call
`model.contextual` and read `model.mlp.w1.weight`. Shapes: prompts `tokens` are (B, n+1, d_in) with
the query x last; weights are (m, d_in) for W_0 and (B, k, m, d_in) for sequences.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import grad, vmap

from experiments.patching.rank1 import context_patch, rank1_update

# -- contextual outputs of every prefix / suffix of the context ---------------------------------


@torch.no_grad()
def prefix_contextual_outputs(contextual: nn.Module, tokens: Tensor) -> Tensor:
    """A(C_i, x) at the query for i = 0..n (row 0 is A(x)); (B, n+1, d_in).

    A causal layer's output at position i is *not* A(C_i, x): the query must come right after c_i.
    So each prefix is its own prompt [c_1..c_i, x]; the n+1 prompts have different lengths, so we
    loop over i and batch over tasks (n forwards of length ≤ n+1 — cheap next to one training step).
    """
    context, query = tokens[:, :-1], tokens[:, -1:]
    return torch.stack([contextual(torch.cat([context[:, :i], query], dim=1))[:, -1]
                        for i in range(context.shape[1] + 1)], dim=1)


@torch.no_grad()
def suffix_contextual_outputs(contextual: nn.Module, tokens: Tensor) -> Tensor:
    """S_i = A(c_{i+1}..c_n, x) at the query for i = 0..n (row 0 is A(C, x), row n is A(x)); (B, n+1, d_in)."""
    n = tokens.shape[1] - 1
    return torch.stack([contextual(tokens[:, i:])[:, -1] for i in range(n + 1)], dim=1)


# -- §3: the prefix patches and their increments ------------------------------------------------


def prefix_patches_from_outputs(W0: Tensor, a_prefix: Tensor) -> Tensor:
    """(ΔW)_i = (W_0 δA_x(C_i)) A(x)ᵀ / ‖A(x)‖², i = 1..n, from A(C_i, x) (B, n+1, d_in); (B, n, m, d_in)."""
    a_query = a_prefix[:, :1].expand_as(a_prefix[:, 1:])
    return context_patch(W0, a_prefix[:, 1:], a_query)


def prefix_patches(model: nn.Module, tokens: Tensor) -> Tensor:
    """(ΔW)_i for the contexts C_i = first i examples, i = 1..n, for every prompt; (B, n, m, d_in).

    Φ_{W+(ΔW)_i}(x) = Φ_W(C_i, x) (Cor. 2.5.1 applied to the prefix).
    """
    with torch.no_grad():
        return prefix_patches_from_outputs(model.mlp.w1.weight, prefix_contextual_outputs(model.contextual, tokens))


def increment_norms(patches: Tensor) -> dict[str, Tensor]:
    """‖(ΔW)_{i+1} − (ΔW)_i‖ for i = 1..n−1 (B, n−1): operator 2-norm ('op2') and Frobenius ('fro').

    Works on any sequence of matrices (B, k, m, d). The increments of §3 are rank-1 (they share
    the right factor A(x)ᵀ), and so are App. E's steps, so for both the two norms agree up to
    rounding: recording both is a check, not redundancy.
    """
    steps = patches.diff(dim=1)
    return {"op2": torch.linalg.matrix_norm(steps, ord=2), "fro": torch.linalg.matrix_norm(steps, ord="fro")}


# -- Prop. 3.1: the steps are gradient steps on L_i(W) = trace(Δ_iᵀ W) ----------------------------


def prop31_deltas(W0: Tensor, a_prefix: Tensor) -> Tensor:
    """Δ_i = W_0 (A(C_i, x) − A(C_{i+1}, x)) A(x)ᵀ for i = 0..n−1; (B, n, m, d_in)."""
    marginal = a_prefix[:, :-1] - a_prefix[:, 1:]  # A(C_i, x) − A(C_{i+1}, x)
    a_query = a_prefix[:, :1]
    return torch.einsum("md,bid,be->bime", W0, marginal, a_query[:, 0])


def trace_loss(W: Tensor, delta: Tensor) -> Tensor:
    """L_i(W) = trace(Δ_iᵀ W), written as in the paper; autograd differentiates it."""
    return torch.trace(delta.T @ W)


def prop31_step(W_i: Tensor, delta: Tensor, a_query: Tensor) -> Tensor:
    """One step W_i − h ∇_W L_i(W_i), h = 1/‖A(x)‖², with the gradient from autograd (torch.func.grad).

    Batched over any leading dims of W_i (..., m, d) and delta (..., m, d); a_query is (..., d).
    """
    lead = W_i.shape[:-2]
    flat_W, flat_D = W_i.reshape(-1, *W_i.shape[-2:]), delta.reshape(-1, *delta.shape[-2:])
    g = vmap(grad(trace_loss))(flat_W, flat_D).reshape(*lead, *W_i.shape[-2:])
    h = 1.0 / a_query.pow(2).sum(-1)
    return W_i - h[..., None, None] * g


def prop31_gd_weights(W0: Tensor, a_prefix: Tensor) -> Tensor:
    """W_0, W_1, ..., W_n reached by Prop. 3.1's steps alone, from W_0: W_(i+1) = W_i − h ∇_W L_i(W_i) with
    the gradient of L_i(W) = trace(Δ_iᵀ W) by autograd; (B, n+1, m, d_in). No patch formula is used: whether
    Φ_(W_i)(x) then equals Φ_(W_0)(C_i, x) is for a forward pass of the model to say."""
    deltas = prop31_deltas(W0, a_prefix)
    a_query = a_prefix[:, 0]
    W = W0.expand(a_prefix.shape[0], *W0.shape)
    out = [W]
    for i in range(deltas.shape[1]):
        W = prop31_step(W, deltas[:, i], a_query)
        out.append(W)
    return torch.stack(out, dim=1)


@torch.no_grad()
def prefix_model_outputs(model: nn.Module, tokens: Tensor) -> Tensor:
    """Φ_(W_0)(C_i, x) for i = 0..n: the whole model's own forward pass on each prompt [c_1..c_i, x], read at
    the query; (B, n+1, d_out). The side of every dynamics claim that no patch formula touches."""
    context, query = tokens[:, :-1], tokens[:, -1:]
    return torch.stack([model(torch.cat([context[:, :i], query], dim=1))[:, -1]
                        for i in range(context.shape[1] + 1)], dim=1)


LEARNED_DECAY_BAR = 0.5  # a decay counts as learned when the trained tail/head ratio is at most half the control's


def decay_vs_control(trained: np.ndarray, control: np.ndarray, tail_fraction: float) -> float:
    """The trained model's tail/head decay ratio over the control's (an untrained model of the same shape).

    A softmax average over i tokens moves by O(1/i) per added token whatever the weights, so "the
    increments decay" alone holds for an untrained model too; below 1 means the trained model's
    increments vanish faster than the architecture alone makes them."""
    ratio = lambda m: decay_summary(m, tail_fraction)["decay_ratio_tail_to_head"]  # noqa: E731
    return float(ratio(trained) / ratio(control))


def slope_vs_control(trained: np.ndarray, control: np.ndarray) -> float:
    """The trained model's fitted power-law exponent minus the control's: how much faster than i^(control
    slope) its increments vanish (0 when the decay is the architecture's alone)."""
    return float(decay_summary(trained, 0.5)["decay_fit_slope"] - decay_summary(control, 0.5)["decay_fit_slope"])


# -- App. E: the factorized dynamics --------------------------------------------------------------


def factorized_weights(W0: Tensor, a_suffix: Tensor) -> Tensor:
    """W_0, W_1, ..., W_n of Eq. 27 from S_i = A(c_{i+1}..c_n, x) (B, n+1, d_in); (B, n+1, m, d_in).

    W_i = W_{i−1} + (W_{i−1} ΔA(c_i)) S_iᵀ / ‖S_i‖²,  ΔA(c_i) = S_{i−1} − S_i: a sequential
    recursion (each step multiplies by the previous W), so a loop over i, batched over tasks.
    """
    W = W0.expand(a_suffix.shape[0], *W0.shape)
    out = [W]
    for i in range(1, a_suffix.shape[1]):
        W = W + rank1_update(W, a_suffix[:, i - 1] - a_suffix[:, i], a_suffix[:, i])
        out.append(W)
    return torch.stack(out, dim=1)


def factor_matrices(a_suffix: Tensor) -> Tensor:
    """I + h_i A_i with A_i = ΔA(c_i) S_iᵀ, h_i = 1/‖S_i‖² (Eqs. 29–30), i = 1..n; (B, n, d_in, d_in)."""
    delta, s = a_suffix[:, :-1] - a_suffix[:, 1:], a_suffix[:, 1:]
    h = 1.0 / s.pow(2).sum(-1)
    eye = torch.eye(a_suffix.shape[-1], dtype=a_suffix.dtype, device=a_suffix.device)
    return eye + h[..., None, None] * delta.unsqueeze(-1) * s.unsqueeze(-2)


def factor_products(W0: Tensor, factors: Tensor) -> Tensor:
    """W_0 (I + h_1 A_1) ⋯ (I + h_i A_i) for i = 0..n (Eq. 31 and its partial products); (B, n+1, m, d_in)."""
    P = W0.expand(factors.shape[0], *W0.shape)
    out = [P]
    for i in range(factors.shape[1]):
        P = P @ factors[:, i]
        out.append(P)
    return torch.stack(out, dim=1)


# -- summaries -----------------------------------------------------------------------------------


def decay_summary(mean_increment: np.ndarray, tail_fraction: float) -> dict[str, float]:
    """How fast the mean increment m_i (i = 1..N−1) vanishes: mean of the last `tail_fraction` of
    the i's over the mean of the first, and a least-squares power law m_i ≈ c i^slope (i ≥ 2)."""
    k = max(1, math.ceil(tail_fraction * len(mean_increment)))
    i = np.arange(1, len(mean_increment) + 1)
    slope, intercept = np.polyfit(np.log(i[1:]), np.log(mean_increment[1:]), 1)
    return {"decay_ratio_tail_to_head": mean_increment[-k:].mean() / mean_increment[:k].mean(),
            "decay_fit_slope": slope, "decay_fit_log_c": intercept}
