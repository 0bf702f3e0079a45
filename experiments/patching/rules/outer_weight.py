"""Thm 9 (outer weight): the block's last matrix W′ (Llama's W_down) absorbs r by a rank-1 update,
ΔW′ = r yᵀ / ‖y‖² with y the matrix's input, so ΔW′ y = r. The closed loop also uses it for a SCALE
block's pre-norm matrix (closed_loop.py: W_down made to output C · sign(d_C))."""

from __future__ import annotations

import torch
from torch import nn

from experiments.patching import lemmas
from experiments.patching.capture import last_position
from experiments.patching.lemmas_ls import outer_weight_ls
from experiments.patching.rounded import add_outer_rounded, add_rank1_by_rows, row_dot
from experiments.patching.rules.base import OutputRule, as_rows, module_input


class OuterWeight(OutputRule):
    key = "outer_weight"  # ΔW′ = r yᵀ / ‖y‖², y = the input of the outer matrix
    theorem = "Thm 9 (outer weight)"
    exact_at_k = True
    takes_ridge = True

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        u, s = lemmas.outer_weight_update(r, values["y"].to(cdt))
        add_outer_rounded(P, u, s, out, cdt=cdt)
        stats.dm_linf = r.abs().max()

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        # Row by row, one read of each row block: r_i = (T − v′)_i − W_i · y′ − b_i, then W_i += r_i y′ᵀ/‖y′‖².
        # Solved without first running the module: its output is W y′ + b, computed here from the same rows.
        y = last_position(module_input(args, kwargs)).to(cdt)
        t = target_minus_v if module.bias is None else target_minus_v - module.bias.to(cdt)
        r = add_rank1_by_rows(P, lambda w, _g, rows, slot: torch.sub(t[rows], row_dot(w, y.view(1, -1), cdt), out=slot),
                              lemmas.outer_weight_direction(y), out, cdt)
        stats.dm_linf = r.abs().max()

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        # ΔW′ = Rᵀ (Yᵀ)⁺: exact at k positions whose inputs y_i are independent (k ≤ n)
        if type(module).__name__ == "Conv1D" or not isinstance(module, nn.Linear):
            raise NotImplementedError(f"{adapter.family}: the outer-weight fit reads an nn.Linear")
        Y = as_rows(module_input(args, kwargs))
        delta = outer_weight_ls(R, Y)
        return delta, Y @ delta.T
