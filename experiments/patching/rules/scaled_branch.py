"""A branch scaled before the residual: T = v + α · g (Granite's `residual_multiplier`). Any Table 1 rule
absorbs it: for the layer's output to move by r the branch g must move by r / α, so the rule is run for
r / α (open loop), for (T(C, x) − v′) / α (closed loop), and for R / α at k positions (the fixed patch,
whose fitted movement of the layer is then α times the branch's).

A wrapper, not a row of Table 1: `BlockAdapter.rule` returns the adapter's rule wrapped in it when the
adapter's `branch_scale` is not 1, so the engine, which asks `adapter.rule`, needs no change. (The closed
loop solves for T = v + g, so variants.py refuses it for such a block.)"""

from __future__ import annotations

from experiments.patching.rules.base import OutputRule


class ScaledBranch(OutputRule):
    def __init__(self, inner: OutputRule, alpha: float):
        if alpha == 0:
            raise ValueError("a branch scaled by 0 carries no context: no patch can move it")
        self.inner, self.alpha = inner, float(alpha)
        self.key, self.exact_at_k = inner.key, inner.exact_at_k
        self.post_norm, self.routed_experts, self.takes_ridge = inner.post_norm, inner.routed_experts, inner.takes_ridge
        self.theorem = f"{inner.theorem}, r / {self.alpha:g} (branch scale)"

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        self.inner.open_loop(adapter, layer, r / self.alpha, values, P, out, cdt, stats)

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        self.inner.closed_loop(adapter, module, P, out, args, kwargs, target_minus_v / self.alpha, cdt, stats)

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        delta, moved = self.inner.fit_positions(adapter, module, P, args, kwargs, R / self.alpha)
        return delta, moved * self.alpha
