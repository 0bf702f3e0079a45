"""Thm 11 (mixture of experts): each expert the router picked gets a rank-1 change of its outer matrix
with ΔW′_j y_j = r / S (S = Σ gates), so the gated mixture moves by exactly r; the others are unchanged.

The experts module is the owner of the adapter's `output_param` (stacked outer matrices, (E, n, I));
the stacked gate/up matrices it reads y_j through are the adapter's one input matrix of layout EXPERTS,
which also lives on that module. Nothing here names an attribute of a particular MoE class but its
activation `act_fn`, and the layout of the fused gate/up (gate first, then up, as Mixtral stores it)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching import lemmas
from experiments.patching.capture import last_position
from experiments.patching.kinds import EXPERTS
from experiments.patching.lemmas_ls import moe_features, moe_ls
from experiments.patching.rules.base import OutputRule


def expert_inputs(adapter, experts: nn.Module) -> Tensor:
    """The stacked gate/up matrices on `experts` (the owner of the output parameter), found through the
    adapter; inside the closed loop's `functional_call` this is the patched tensor the experts read."""
    owner_path = adapter.output_param.rsplit(".", 1)[0]
    names = [n for n, layout in adapter.input_matrices.items() if layout == EXPERTS]
    if len(names) != 1 or names[0].rsplit(".", 1)[0] != owner_path:
        raise ValueError(f"{adapter.family}: the MoE rule needs one EXPERTS input matrix on {owner_path!r}")
    return getattr(experts, names[0].rsplit(".", 1)[1])


def moe_down_rounded(experts: nn.Module, P: Tensor, out: Tensor, gate_up: Tensor, z: Tensor, index: Tensor,
                     gates: Tensor, r: Tensor, cdt: torch.dtype) -> None:
    """Each active expert's W_down,j gets ΔW′_j y_j = r / S, y_j its hidden state for z through `gate_up`
    (as the experts' eager forward computes it); the other experts keep W_down,j. Written rounded. The
    active experts are gathered by index on the device (no list of them read back to the host)."""
    active = index.reshape(-1).long()
    g, u = torch.matmul(gate_up[active], z.reshape(-1)).chunk(2, dim=-1)
    ys = (experts.act_fn(g) * u).to(cdt)
    pairs = lemmas.moe_updates(r, gates.reshape(-1).to(cdt), ys)
    us, ss = torch.stack([u for u, _ in pairs]), torch.stack([s for _, s in pairs])
    out.copy_(P)
    out[active] = (P[active].to(cdt) + us[:, :, None] * ss[:, None, :]).to(out.dtype)


class MixtureOfExperts(OutputRule):
    key = "moe"  # each active expert's outer matrix adds r / S
    theorem = "Thm 11 (MoE)"
    exact_at_k = True
    routed_experts = True

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        # the routing and z of the with-context pass: the input update makes the patched router see z_C
        _logits, gates, index = values["router"]
        experts = adapter.owner(layer)
        moe_down_rounded(experts, P, out, expert_inputs(adapter, experts), values["z"], index, gates, r, cdt)
        stats.dm_linf = r.abs().max()

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        # for the experts the patched router picked, with their patched gate/up (the experts' own input)
        r = self.residual_in_pass(module, P, out, args, kwargs, target_minus_v, cdt)
        hidden, index, gates = args[:3]
        moe_down_rounded(module, P, out, expert_inputs(adapter, module), last_position(hidden), index[-1],
                         gates[-1], r, cdt)
        stats.dm_linf = r.abs().max()

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        # stacked [ΔW′_1 … ΔW′_E] Φᵀ = Rᵀ, Φ_i = [a_i1 y_i1, …, a_iE y_iE] (a_ie = 0 for experts not picked):
        # exact when the Φ_i are independent (k ≤ E·n)
        hidden, index, weights = args[:3]
        E = P.shape[0]
        z = hidden.double()
        gate_up = expert_inputs(adapter, module).detach().double()  # already patched (input side)
        g, u = torch.einsum("kd,eod->keo", z, gate_up).chunk(2, dim=-1)
        ys = module.act_fn(g) * u  # (k, E, n): every expert's outer input
        a = torch.zeros(z.shape[0], E, dtype=torch.float64, device=z.device)
        a.scatter_(1, index.long(), weights.double())
        Phi = moe_features(ys, a)
        delta = moe_ls(R, Phi, E)
        return delta, Phi @ delta.permute(1, 0, 2).reshape(R.shape[1], -1).T
