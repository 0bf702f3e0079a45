"""Goldwaser et al. §5, Table 1: the controllability lemmas, written once, on plain vectors.

A block is T(C, x) = v_C + g(f(z_C)): the residual before the MLP v_C (v without the context), the
MLP's normalized input z_C = N(v_C) (z = N(v)), an inner function f that reads z through input
matrices, and an outer function g whose parameters can absorb a change of the block's output.
Theorem 5: the context's whole effect moves into the weights when f is input-controllable (every
input matrix sees z_C through z) and g is output-controllable (its output moves by any residual r).

Input update (Thms 6–7), for every matrix W that reads z (gate, up, fc_in, an MoE router, every
expert's gate/up):                      ΔW = W (z_C − z) zᵀ / ‖z‖²   so (W + ΔW) z = W z_C.
Output updates, each making the outer function's output move by r (Thm 8–12):
  outer bias (Thm 8)            Δb = r
  outer weight (Thm 9)          ΔW′ = r yᵀ / ‖y‖²            y: the outer matrix's input, ΔW′ y = r
  elementwise scale (Thm 10)    Δm = r ⊘ h                   h: the pre-scale output
  mixture of experts (Thm 11)   each active expert j adds r / S  (S = Σ_j router gate_j; by its outer
                                weight: ΔW′_j = (r / S) y_jᵀ / ‖y_j‖²)
  parallel block (Thm 12)       the MLP never sees the attention output: the whole attention change
                                r = A(C, x) − A(∅, x) goes into the MLP's output parameters.

In Algorithm 1, r = v_C − v (the change of the attention sub-layer's residual). Rank-1 updates are
returned as factors (u, s) with ΔW = u sᵀ, so callers can add them to a weight in one rounding.
Nothing here knows a model: the adapters in `arch/` say where z, y, h and the parameters are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

# Inside a patched pass, the checks that need a tensor's value (is z = 0?) are queued as device flags and read
# once at the end of the pass with its statistics (`PatchedPass.finish`), not one host read per matrix. A plain
# module-level stack, not a ContextVar: torch.compile traces a list (a compiled step, step_graph.py), and breaks
# its graph at every ContextVar get and set. Patched passes run one at a time in a thread.
_DEFERRED: list[list[tuple[Tensor, str]]] = []


@contextmanager
def deferred_checks() -> Iterator[list[tuple[Tensor, str]]]:
    """Queue the value checks made inside the block as (flag, message) pairs instead of reading each."""
    checks: list[tuple[Tensor, str]] = []
    _DEFERRED.append(checks)
    try:
        yield checks
    finally:
        _DEFERRED.pop()


def _direction(x: Tensor, undefined: str) -> Tensor:
    """x / ‖x‖² over the last dimension (one direction per row of a stack, each row's own sum: the same bits
    for a row alone or among others)."""
    sq = x.square().sum(-1, keepdim=True)
    checks = _DEFERRED[-1] if _DEFERRED else None
    if checks is not None:
        zero = sq == 0.0
        checks.append((zero if zero.numel() == 1 else zero.any(), undefined))
    elif bool((sq == 0.0).any()):
        raise ValueError(undefined)
    return x / sq


def input_direction(z: Tensor) -> Tensor:
    """s = z / ‖z‖², the row factor of every input update (s · z = 1); needs z ≠ 0 (Lemma 6). z (n,), or
    (L, n) for a stack of layers, a direction each."""
    return _direction(z, "z = 0: the rank-1 input patch is undefined (Lemma 6 needs z ≠ 0)")


def input_update(W: Tensor, z_c: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """Thms 6–7: factors (u, s) of ΔW = W (z_C − z) zᵀ / ‖z‖². W is (..., out, in): batched over
    leading dimensions (an MoE's experts); needs z ≠ 0 (Lemma 6)."""
    return W @ (z_c - z), input_direction(z)


def outer_bias_update(r: Tensor) -> Tensor:
    """Thm 8: Δb = r (the bias is added after everything that reads the context)."""
    return r.clone()


def outer_weight_direction(y: Tensor) -> Tensor:
    """s = y / ‖y‖², the row factor of an outer-weight update (s · y = 1); needs y ≠ 0 (Thm 9)."""
    return _direction(y, "y = 0: the outer-weight patch is undefined (Thm 9 needs y ≠ 0)")


def outer_weight_update(r: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Thm 9: factors (u, s) of ΔW′ = r yᵀ / ‖y‖², so ΔW′ y = r. Needs y ≠ 0."""
    return r, outer_weight_direction(y)


def divide_or_zero(numerator: Tensor, denominator: Tensor) -> tuple[Tensor, Tensor]:
    """numerator ⊘ denominator, 0 where the denominator is 0 or the quotient is not finite; and how many
    (a 0-d tensor on the device: the patched pass reads its statistics back once, not per layer).
    (Lemma 10: where h_i = 0 coordinate i cannot be moved by a scale; it stays uncorrected, counted.)"""
    q = numerator / denominator
    bad = ~torch.isfinite(q)
    return torch.where(bad, torch.zeros_like(q), q), bad.sum()


def scale_update(r: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
    """Thm 10: Δm = r ⊘ h (with the division rule above); returns (Δm, coordinates not movable)."""
    return divide_or_zero(r, h)


def sign_pre_norm_target(d: Tensor) -> Tensor:
    """C · sign(d), C = RMS(d) (sign 0 read as +1): a pre-norm vector with d's RMS whose RMS-normalized
    form is ±1 in every coordinate. The conditioned closed loop (closed_loop.py) has the matrix before a
    post-MLP norm output it (Thm 9), so that the scale's update (Thm 10) divides by ±1, never by an
    MLP output near 0. d's own signs keep the matrix's change small."""
    rms = d.square().mean().sqrt()
    return torch.where(d < 0, -rms, rms)


def moe_updates(r: Tensor, gates: Tensor, ys: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Thm 11: for the active experts j, with router gates g_j (K,) and outer-matrix inputs y_j (K, n),
    outer-weight factors with ΔW′_j y_j = r / S, S = Σ_j g_j: the mixture Σ_j g_j (o_j + r / S) then moves
    by exactly r. The router must see z_C (input update) so that the same experts fire with the same gates."""
    total = gates.sum()
    return [outer_weight_update(r / total, y) for y in ys]


def parallel_block_residual(attn_c: Tensor, attn: Tensor) -> Tensor:
    """Thm 12: in T = x + A(C, x) + g(f(x)) the MLP input f(x) has no context, so the residual the MLP's
    output parameters must absorb is the whole attention change A(C, x) − A(∅, x)."""
    return attn_c - attn
