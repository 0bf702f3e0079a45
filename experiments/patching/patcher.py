"""Algorithm 1 on any supported decoder, with the model's own forward doing the patched pass.

For one query token after a context:
1. The with-context pass (KV-cached, as in generation) leaves, per layer and at the query position,
   what the lemmas need: the layer's input x and output T(C, x), the residual v_C, the MLP input z_C
   and the output rule's inputs (hooks; `capture_context`).
2. The patched pass is the stock model's forward of the query token alone. Each decoder layer's
   forward is intercepted: the patch is computed from the hidden state that reaches the layer, then the
   layer runs its own forward with W + ΔW rounded to the model's dtype (`functional_call`). Embedding,
   positions, masks, final norm, logit soft-capping: all the model's own.

Variants (where layer l's patch is computed):
- naive (the paper's Algorithm 1, open loop): against the with-context pass's input x_{l−1} (the target),
  output rule with r = v_C − v(x_{l−1}). The patched pass's real input differs from x_{l−1} by rounding
  (and, with absolute positions, by the position embedding): open loop, errors propagate.
- stable (App. B, Gemma 3 only): as naive, W_down and the post-MLP scale from the RMSNorm inversion.
- conditioned (Gemma 3 only): as stable, with W_down's target C · sign(d_C), so that Eq. 4's Δm divides by
  ±1, not by MLP outputs near 0. Still the open loop: on the trained Gemma 3 270M it holds at rounding
  level at every layer (float32 ~1e-7, float64 ~1e-15) where naive's error grows ~10× a layer.
- closed_loop (`closed_loop.py`): against the hidden state x′ the patched pass actually produced, inside
  the layer's one forward: the input update for its own z′, then the output rule solved for the exact
  with-context output T(C, x) against what the rounded input update gives. Rounding is fed back, not
  amplified. For a post-norm block (Gemma 3, OLMo 2) W_down is patched too, so that the scale's update
  divides by ±1 (a patched model that a stock forward reproduces); closed_loop_scale is Thm 10 alone, as
  naive, in the closed loop.

Patch arithmetic is float32 (float64 for float64 models); only W + ΔW is rounded, once.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching.arch import CLOSED_LOOP, adapter_for, check_variant
from experiments.patching.capture import (
    LayerCapture,
    StopAtMLP,
    capture_context,
    first_output,
    last_position,
    register_captures,
    residual,
)
from experiments.patching.closed_loop import patched_layer_forward
from experiments.patching.output_rules import LayerPatchStats, apply_output_rule
from experiments.patching.rounded import PatchBuffers, compute_dtype, input_update_rounded


@dataclass
class PatchedPass:
    logits: Tensor | None  # (vocab,) float32
    hidden_linf: list[float]  # per layer: max |x′_l − x_l| between the patched pass and the with-context pass
    hidden_rel: list[float]  # the same, over max |x_l|
    layer_stats: list[LayerPatchStats] = field(default_factory=list)

    @property
    def div_zero(self) -> int:
        return sum(s.div_zero for s in self.layer_stats)

    @property
    def no_root(self) -> int:
        return sum(s.no_root for s in self.layer_stats)

    @property
    def dm_linf(self) -> float:
        return max(s.dm_linf for s in self.layer_stats)

    @property
    def routing_changed(self) -> int:
        return sum(s.routing_changed for s in self.layer_stats)


def _cache_name(module: nn.Module) -> str:
    """The KV cache's argument and output name: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name warns, and goes in 5.40); earlier versions know only `past_key_values`."""
    return _cache_name_of(type(module))


@functools.cache  # once per model class, not on every generated token
def _cache_name_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


# -- the patcher -------------------------------------------------------------------------------------
class Patcher:
    """Per-token patches for any supported transformers causal LM (see `arch/`)."""

    def __init__(self, model: nn.Module, variant: str = "naive"):
        self.model = model
        self.variant = variant
        self.adapter = adapter_for(model.config.model_type)
        check_variant(self.adapter, variant)
        self.lm = self.adapter.decoder(model)
        self.text_config = self.lm.config
        self.layers = self.adapter.layers(model)
        self.dtype = next(self.lm.parameters()).dtype
        self.cdt = compute_dtype(self.dtype)
        self.bufs = PatchBuffers(dtype=self.dtype)
        names = {id(m): n for n, m in model.named_modules()}
        self.layer_names = [names[id(layer)] for layer in self.layers]
        self._inside = False

    # -- the with-context side ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inputs: dict):
        return getattr(self.model(**inputs, use_cache=True, logits_to_keep=1), _cache_name(self.model))

    @torch.no_grad()
    def context_step(
        self, inputs: dict, cache, logits: bool = True
    ) -> tuple[Tensor | None, list[LayerCapture], object]:
        """The with-context forward of the newest token(s) on top of `cache`: (logits, captures, cache).
        `logits=False` runs the decoder body alone (no final norm's logits, no LM head: None), for when
        only the per-layer targets are needed; the captures are the same bits."""
        with capture_context(self.adapter, self.layers) as caps:
            if not logits:
                name = _cache_name(self.lm)
                return None, caps, getattr(self.lm(**inputs, **{name: cache}, use_cache=True), name)
            name = _cache_name(self.model)
            out = self.model(**inputs, **{name: cache}, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float(), caps, getattr(out, name)

    @torch.no_grad()
    def control_logits(self, query: Tensor) -> Tensor:
        """The control: the unpatched model's own forward of the query token alone (no context)."""
        return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].float()

    @torch.no_grad()
    def stock_logits(self, query: Tensor, patched: dict[str, Tensor]) -> Tensor:
        """The patched model as stock transformers runs it: the `patched` tensors (full parameter names, as
        `patched_pass(keep=...)` gives them) written into the model's own parameters, in their own storage,
        and the model's forward of the query alone, with no hook, no interception; the parameters are then
        restored bit for bit. What the patched pass gave counts only if this gives it too: the bits of a
        product depend on more than its operands (MKL's on a weight's memory alignment)."""
        params = dict(self.model.named_parameters())
        saved = {name: params[name].detach().clone() for name in patched}
        try:
            for name, tensor in patched.items():
                params[name].copy_(tensor)
            return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].float()
        finally:
            for name, tensor in saved.items():
                params[name].copy_(tensor)

    # -- the patched side ---------------------------------------------------------------------------
    @torch.no_grad()
    def patched_pass(self, query: Tensor, caps: list[LayerCapture], keep: dict | None = None) -> PatchedPass:
        """The model's forward of the query token alone, every layer patched on the fly (see module doc).
        With `keep`, the patched tensors are also copied into it under their full parameter names."""
        result = PatchedPass(logits=None, hidden_linf=[], hidden_rel=[])
        originals = []
        for index, layer in enumerate(self.layers):
            originals.append(layer)
            layer.forward = self._intercept(index, layer, caps[index], result, keep)
        try:
            out = self.model(input_ids=query.view(1, 1), use_cache=False)
        finally:
            for layer in originals:
                del layer.forward
        result.logits = out.logits[0, -1].float()
        return result

    def _intercept(self, index, layer, cap, result, keep):
        own_forward = type(layer).forward

        def forward(*args, **kwargs):
            if self._inside:  # a call made by the patching itself: the layer's own forward
                return own_forward(layer, *args, **kwargs)
            self._inside = True
            try:
                return self._patch_and_run(index, layer, cap, args, kwargs, result, keep)
            finally:
                self._inside = False

        return forward

    def _run(self, layer, args, kwargs, hidden, params, stop_at_mlp=False) -> tuple[dict, object]:
        """The layer's own forward on `hidden` with `params` substituted, recording the adapter's values."""
        values = {"x_in": last_position(hidden)}
        if args:
            args = (hidden, *args[1:])
        else:
            kwargs = dict(kwargs, hidden_states=hidden)
        handles = register_captures(self.adapter, layer, values, stop_at_mlp)
        output = None
        try:
            output = functional_call(layer, params, args, kwargs)
            values["out"] = last_position(first_output(output))
        except StopAtMLP:
            pass
        finally:
            for h in handles:
                h.remove()
        return values, output

    def _patch_and_run(self, index, layer, cap, args, kwargs, result, keep):
        hidden = args[0] if args else kwargs["hidden_states"]
        if self.variant in CLOSED_LOOP:  # patched inside the layer's one forward
            values, output, stats = patched_layer_forward(self.adapter, layer, cap, args, kwargs, self.bufs, self.cdt,
                                                          conditioned=self.variant == "closed_loop")
        else:
            stats = self.patch_layer(layer, cap, hidden, args, kwargs)
            values, output = self._run(layer, args, kwargs, hidden, self.bufs.tensors)
        result.layer_stats.append(stats)
        if keep is not None:
            keep.update({f"{self.layer_names[index]}.{k}": t.clone() for k, t in self.bufs.tensors.items()})
        if "router" in values and "router" in cap.values:  # MoE: did the same experts fire?
            stats.routing_changed = int(set(values["router"][2].tolist()) != set(cap.values["router"][2].tolist()))
        target = cap.x_out.double()
        err = float((values["out"].double() - target).abs().max())
        result.hidden_linf.append(err)
        result.hidden_rel.append(err / max(float(target.abs().max()), 1e-300))
        return output

    def patch_layer(self, layer: nn.Module, cap: LayerCapture, hidden: Tensor, args=(), kwargs=None) -> LayerPatchStats:
        """Open loop (naive, stable): fill self.bufs with this layer's patched tensors, computed against the
        with-context pass's input to the layer (the target), whatever the patched pass's `hidden` is."""
        if self.variant in CLOSED_LOOP:
            raise ValueError("closed_loop patches inside the layer's forward (closed_loop.patched_layer_forward)")
        A, cdt, bufs = self.adapter, self.cdt, self.bufs
        kwargs = kwargs or {}
        x_ref = cap.x_in.to(hidden.dtype).view_as(hidden)
        bufs.begin()
        alone, _ = self._run(layer, args, kwargs, x_ref, {}, stop_at_mlp=True)  # v and z without context
        for name, layout in A.input_matrices.items():  # Thms 6–7 (+ the router, Thm 11)
            W = layer.get_parameter(name)
            input_update_rounded(W, layout, cap.z_c, alone["z"], bufs.out(name, W), cdt)
        r = residual(cap.values).to(cdt) - residual(alone).to(cdt)  # v_C − v (Thm 12: A_C − A)
        if self.variant in ("stable", "conditioned"):
            from experiments.patching.gemma3 import stable_down_and_scale

            return stable_down_and_scale(layer, cap, r, bufs, cdt, sign_target=self.variant == "conditioned")
        return apply_output_rule(A, layer, r, cap.values, bufs, cdt)
