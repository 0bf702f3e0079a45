"""Thm 8 (outer bias): the block adds a bias after everything that reads the context (GPT-2's c_proj,
GPT-J's fc_out), so Δb = r moves the output by r whatever the MLP's input was."""

from __future__ import annotations

from experiments.patching import lemmas
from experiments.patching.lemmas_ls import outer_bias_ls
from experiments.patching.rules.base import OutputRule


class OuterBias(OutputRule):
    key = "outer_bias"  # Δb = r
    theorem = "Thm 8 (outer bias)"

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        db = lemmas.outer_bias_update(r)
        out.copy_(P.to(cdt) + db)
        stats.dm_linf = db.abs().max()

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        r = self.residual_in_pass(module, P, out, args, kwargs, target_minus_v, cdt)
        out.copy_(P.to(cdt) + lemmas.outer_bias_update(r))
        stats.dm_linf = r.abs().max()

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        # one Δb for every row: their mean, exact only at k = 1
        delta = outer_bias_ls(R)
        return delta, delta.expand_as(R)
