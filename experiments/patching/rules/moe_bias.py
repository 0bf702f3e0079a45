"""Thm 8 inside Thm 11: an MoE whose experts have outer biases (gpt-oss). Each expert the router picked gets
Δb_j = r / S (S = Σ gates of the active experts), so the gated mixture Σ_j g_j (W_j y_j + b_j + Δb_j) moves
by exactly r, whatever the experts compute inside (gpt-oss's clamped, interleaved SwiGLU included): unlike
Thm 11's outer-matrix update, nothing here recomputes an expert's hidden state. The router must see z_C
(it is an input matrix, its bias untouched), so that the same experts fire with the same gates.

The owner of the adapter's `output_param` is the experts module (its stacked biases, (E, d)); the router's
output, captured as (logits, gates, indices), gives the routing."""

from __future__ import annotations

import torch
from torch import Tensor

from experiments.patching.capture import last_position
from experiments.patching.rules.base import OutputRule


def moe_bias_updates(r: Tensor, gates: Tensor) -> Tensor:
    """Δb_j = r / S for each of the K active experts (K, d): Σ_j g_j Δb_j = r."""
    return (r / gates.sum()).expand(gates.shape[0], -1)


def moe_bias_rounded(P: Tensor, out: Tensor, index: Tensor, gates: Tensor, r: Tensor, cdt: torch.dtype) -> None:
    out.copy_(P)
    for j, delta in zip(index.reshape(-1).tolist(), moe_bias_updates(r.to(cdt), gates.reshape(-1).to(cdt)),
                        strict=True):
        out[j].copy_(P[j].to(cdt) + delta)


class MixtureOfExpertBiases(OutputRule):
    key = "moe_bias"  # Thm 8 in Thm 11: each active expert's outer bias adds r / S
    routed_experts = True
    theorem = "Thm 11 with Thm 8 (each active expert's outer bias)"
    exact_at_k = True  # k ≤ E positions with independent gate rows: the least-squares fit is exact

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        _logits, gates, index = values["router"]
        moe_bias_rounded(P, out, index, gates, r, cdt)
        stats.dm_linf = float(r.abs().max())

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        r = self.residual_in_pass(module, P, out, args, kwargs, target_minus_v, cdt)
        _hidden, index, gates = args[:3]
        moe_bias_rounded(P, out, last_position(index), last_position(gates), r, cdt)
        stats.dm_linf = float(r.abs().max())

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        # position i moves by Σ_e a_ie Δb_e (a_ie: expert e's gate there, 0 if not picked): A Δb = R
        _hidden, index, weights = args[:3]
        A = torch.zeros(R.shape[0], P.shape[0], dtype=torch.float64, device=index.device)  # where the layer is
        A.scatter_(1, index.long(), weights.double())
        delta = torch.linalg.lstsq(A, R.double().to(A.device)).solution
        return delta, A @ delta
