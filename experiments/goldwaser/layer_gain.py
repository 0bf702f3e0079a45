"""How much one decoder layer, or the whole model, amplifies a small change of its input, measured directly.

- `layer_calls`: one stock forward of the query token alone (what the patched pass runs) records, per decoder
  layer, the arguments the model passes it (hidden state, rotary tables, mask ...), so the layer can be run
  again on its own on any hidden state, with its original parameters or with substituted (patched) ones.
- `gain`: ‖f(x + δ) − f(x)‖ / ‖δ‖ by finite difference (and relative to ‖f(x)‖ / ‖x‖), for a map f and
  a given δ. δ is the difference actually represented in the dtype ((x + δ) − x), so the ratio is exact
  up to f's own rounding.
- `one_ulp_sensitivity`: the whole model's relative logit change when its embedding output moves by one
  ulp in every coordinate (`torch.nextafter`): how far a patched model's output moves for the smallest
  change its input can make, beside the unpatched model's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call


@dataclass
class LayerCall:
    """A decoder layer as the model called it: run it again on another hidden state with `run`."""

    layer: nn.Module
    args: tuple
    kwargs: dict

    def run(self, x: Tensor, params: dict[str, Tensor] | None = None) -> Tensor:
        """The layer's output for hidden state `x` (d,) of the one query position, with
        `params` (names relative to the layer) in place of its own."""
        hidden = self.args[0] if self.args else self.kwargs["hidden_states"]
        h = x.to(hidden.dtype).reshape(hidden.shape)  # the query alone: one position
        if self.args:
            args, kwargs = (h, *self.args[1:]), self.kwargs
        else:
            args, kwargs = (), dict(self.kwargs, hidden_states=h)
        out = functional_call(self.layer, params or {}, args, kwargs)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(-1, out.shape[-1])[-1]


@torch.no_grad()
def layer_calls(model: nn.Module, layers: nn.ModuleList, query: Tensor) -> list[LayerCall]:
    """Each layer's arguments in `model`'s own forward of the one token `query` without a cache (`model` the
    causal LM, or its decoder body alone, which skips the LM head)."""
    calls: list[LayerCall | None] = [None] * len(layers)

    def keep(index: int):
        def hook(layer, args, kwargs):
            calls[index] = LayerCall(layer, tuple(args), dict(kwargs))

        return hook

    handles = [layer.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        model(input_ids=query.view(1, 1), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if any(c is None for c in calls):
        raise RuntimeError("a decoder layer was not called in the model's forward")
    return calls  # type: ignore[return-value]


def random_direction(x: Tensor, relative: float, generator: torch.Generator) -> Tensor:
    """A random δ of norm `relative` · ‖x‖ (drawn in float64, then cast to x's dtype), on x's device. Drawn by
    the CPU `generator` and then moved: the same δ on every device for a seed (a CUDA generator draws other
    numbers), so a GPU run measures the gain along the CPU run's direction; the scale is computed where x is,
    without a read back to the host."""
    d = torch.randn(x.shape, generator=generator, dtype=torch.float64).to(x.device)
    return (d * (relative * x.double().norm() / d.norm())).to(x.dtype)


@torch.no_grad()
def gain(f: Callable[[Tensor], Tensor], x: Tensor, delta: Tensor) -> tuple[float, float]:
    """(‖f(x + δ) − f(x)‖ / ‖δ‖, the same relative: over ‖f(x)‖ / ‖x‖), δ as represented, (x + δ) − x in
    x's dtype, norms in float64. The relative gain is what multiplies a relative hidden-state error: the
    residual stream's norm grows from layer to layer, so the absolute gain of a layer is above 1 even
    where it does not amplify relative errors."""
    moved = x + delta
    step = (moved.double() - x.double()).norm()
    if float(step) == 0.0:
        raise ValueError("δ is below x's rounding: nothing moved")
    fx = f(x).double()
    absolute = float((f(moved).double() - fx).norm() / step)
    return absolute, absolute * float(x.double().norm()) / max(float(fx.norm()), 1e-300)


@torch.no_grad()
def one_ulp_sensitivity(model: nn.Module, query: Tensor, params: dict[str, Tensor] | None = None) -> float:
    """max |Δlogit| / max |logit| of the model's forward of `query` alone when its embedding output moves
    one ulp up in every coordinate; `params` (full parameter names) replace the model's own."""
    emb = model.get_input_embeddings()(query.view(1, -1))
    bumped = torch.nextafter(emb, torch.full_like(emb, float("inf")))

    def logits(e: Tensor) -> Tensor:
        out = functional_call(model, params or {}, (), {"inputs_embeds": e, "use_cache": False})
        return out.logits[0, -1].double()

    a, b = logits(emb), logits(bumped)
    return float((a - b).abs().max() / a.abs().max())
