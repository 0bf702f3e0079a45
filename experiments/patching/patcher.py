"""Per-token patches on any supported decoder, with the model's own forward doing the patched pass.

For one query token after a context:
1. The with-context pass (KV-cached, as in generation) leaves two things, kept apart (`ContextStep`):
   the targets, per layer and at the query position, what a variant's solver needs (the layer's input x
   and output T(C, x), the residual v_C, the MLP input z_C, the output rule's inputs: `capture_context`);
   and the record, each layer's output recorded by hooks of its own (`record_outputs`), which no solver
   is handed. Every per-layer error (hidden_linf, hidden_rel) is measured against the record, so a solver
   fed wrong targets shows large errors where they were wrong, even one that forces its output to them.
2. The patched pass is the stock model's forward of the query token alone. Each decoder layer's forward is
   intercepted and handed to the variant (`variants.py`), which patches it from its targets and runs the
   layer's own forward with W + ΔW rounded to the model's dtype (`functional_call`). Embedding, positions,
   masks, final norm, logit soft-capping: all the model's own.

The variants (`variants.py`): the open loop (naive = Algorithm 1, stable = App. B, conditioned) computes
each layer's patch from the with-context pass alone (`open_loop.py`): the paper's method, so its agreement
is evidence. The closed loop (`closed_loop.py`) solves each layer, inside the pass, for the with-context
output itself: exact by design for any targets (the last layer alone suffices: `closed_loop_last`, its
control), so its logit agreement is a construction, not evidence for Theorem 1.

Patch arithmetic is float32 (float64 for float64 models); only W + ΔW is rounded, once. Logits are
compared in float32, or in float64 for a float64 model (float64 end to end).
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.patching.arch import adapter_for
from experiments.patching.capture import LayerCapture, capture_context, first_output, last_position, record_outputs
from experiments.patching.compare import logit_dtype
from experiments.patching.rounded import PatchBuffers, compute_dtype
from experiments.patching.rules import LayerPatchStats
from experiments.patching.variants import Variant, check_variant


@dataclass
class ContextStep:
    """One with-context step at the query position: what the solvers get and, apart, what they are judged by."""

    logits: Tensor | None  # (vocab,) in logit_dtype; None when only the decoder body ran
    targets: list[LayerCapture]  # per layer: the values a variant's patch is computed from
    record: list[Tensor]  # per layer: its output, recorded by hooks of its own; never handed to a solver
    cache: object


@dataclass
class PatchedPass:
    logits: Tensor | None  # (vocab,) in logit_dtype
    hidden_linf: list[float]  # per layer: max |x′_l − x_l|, the patched pass against the record
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
        return max((s.dm_linf for s in self.layer_stats), default=0.0)

    @property
    def routing_changed(self) -> int:
        return sum(s.routing_changed for s in self.layer_stats)

    def compare_layer(self, output: Tensor, reference: Tensor) -> None:
        """Append one layer's error: its output at the query position against the record's."""
        ref = reference.double()
        err = float((output.double() - ref).abs().max())
        self.hidden_linf.append(err)
        self.hidden_rel.append(err / max(float(ref.abs().max()), 1e-300))


def _cache_name(module: nn.Module) -> str:
    """The KV cache's argument and output name: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name warns, and goes in 5.40); earlier versions know only `past_key_values`."""
    return _cache_name_of(type(module))


@functools.cache  # once per model class, not on every generated token
def _cache_name_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


@contextmanager
def patched_weights(model: nn.Module, tensors: dict[str, Tensor]):
    """Inside the block, `model`'s parameters hold the patched `tensors` (full parameter names, as
    `Patcher.patched_pass(keep=...)` gives them), copied into their own storage; after it, their own values
    again, bit for bit."""
    params = dict(model.named_parameters())
    saved = {name: params[name].detach().clone() for name in tensors}
    try:
        with torch.no_grad():
            for name, tensor in tensors.items():
                params[name].copy_(tensor)
        yield model
    finally:
        with torch.no_grad():
            for name, tensor in saved.items():
                params[name].copy_(tensor)


# -- the patcher -------------------------------------------------------------------------------------
class Patcher:
    """Per-token patches for any supported transformers causal LM (see `arch/` and `variants.py`)."""

    def __init__(self, model: nn.Module, variant: str = "naive"):
        self.model = model
        self.adapter = adapter_for(model.config.model_type)
        self.variant: Variant = check_variant(self.adapter, variant)
        self.lm = self.adapter.decoder(model)
        self.text_config = self.lm.config
        self.layers = self.adapter.layers(model)
        self.dtype = next(self.lm.parameters()).dtype
        self.cdt = compute_dtype(self.dtype)
        self.logit_dtype = logit_dtype(self.dtype)
        self.bufs = PatchBuffers(dtype=self.dtype)
        names = {id(m): n for n, m in model.named_modules()}
        self.layer_names = [names[id(layer)] for layer in self.layers]
        self._inside = False

    # -- the with-context side ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inputs: dict):
        return getattr(self.model(**inputs, use_cache=True, logits_to_keep=1), _cache_name(self.model))

    @torch.no_grad()
    def context_step(self, inputs: dict, cache, logits: bool = True) -> ContextStep:
        """The with-context forward of the newest token(s) on top of `cache`. `logits=False` runs the decoder
        body alone (no final norm, no LM head: logits None), for when only the per-layer targets are needed;
        the targets and the record are the same bits."""
        with capture_context(self.adapter, self.layers) as targets, record_outputs(self.layers) as record:
            if not logits:
                name = _cache_name(self.lm)
                cache = getattr(self.lm(**inputs, **{name: cache}, use_cache=True), name)
                return ContextStep(None, targets, record, cache)
            name = _cache_name(self.model)
            out = self.model(**inputs, **{name: cache}, use_cache=True, logits_to_keep=1)
        return ContextStep(out.logits[0, -1].to(self.logit_dtype), targets, record, getattr(out, name))

    @torch.no_grad()
    def control_logits(self, query: Tensor) -> Tensor:
        """The control: the unpatched model's own forward of the query token alone (no context)."""
        return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].to(self.logit_dtype)

    @torch.no_grad()
    def control_pass(self, query: Tensor, record: list[Tensor]) -> PatchedPass:
        """The control with its per-layer errors: the unpatched model on the query alone, each layer's output
        against the with-context record. It shows how far the record is from what no patch gives, so that
        a patched pass close to the record is not close by accident."""
        with record_outputs(self.layers) as outputs:
            logits = self.control_logits(query)
        result = PatchedPass(logits=logits, hidden_linf=[], hidden_rel=[])
        for output, reference in zip(outputs, record, strict=True):
            result.compare_layer(output, reference)
        return result

    @torch.no_grad()
    def stock_logits(self, query: Tensor, patched: dict[str, Tensor]) -> Tensor:
        """The patched model as stock transformers runs it: the `patched` tensors (full parameter names, as
        `patched_pass(keep=...)` gives them) written into the model's own parameters, in their own storage,
        and the model's forward of the query alone, with no hook, no interception; the parameters are then
        restored bit for bit. What the patched pass gave counts only if this gives it too: the bits of a
        product depend on more than its operands (MKL's on a weight's memory alignment)."""
        with patched_weights(self.model, patched):
            return self.control_logits(query)

    # -- the patched side ---------------------------------------------------------------------------
    @torch.no_grad()
    def patched_pass(self, query: Tensor, step: ContextStep, keep: dict | None = None,
                     variant: Variant | None = None) -> PatchedPass:
        """The model's forward of the query token alone, every layer patched on the fly by `variant` (the
        patcher's own by default) from `step.targets`, each layer's output compared with `step.record`.
        With `keep`, the patched tensors are also copied into it under their full parameter names."""
        variant = variant or self.variant
        result = PatchedPass(logits=None, hidden_linf=[], hidden_rel=[])
        originals = []
        for index, layer in enumerate(self.layers):
            originals.append(layer)
            layer.forward = self._intercept(variant, index, layer, step, result, keep)
        try:
            out = self.model(input_ids=query.view(1, 1), use_cache=False)
        finally:
            for layer in originals:
                del layer.forward
        result.logits = out.logits[0, -1].to(self.logit_dtype)
        return result

    def _intercept(self, variant, index, layer, step, result, keep):
        own_forward = type(layer).forward

        def forward(*args, **kwargs):
            if self._inside:  # a call made by the patching itself: the layer's own forward
                return own_forward(layer, *args, **kwargs)
            self._inside = True
            try:
                return self._patch_and_run(variant, index, layer, step, args, kwargs, result, keep)
            finally:
                self._inside = False

        return forward

    def _patch_and_run(self, variant, index, layer, step, args, kwargs, result, keep):
        target = step.targets[index]
        if variant.patches_layer(index, len(self.layers)):
            values, output, stats = variant.patch(self, layer, target, args, kwargs)
            if keep is not None:
                keep.update({f"{self.layer_names[index]}.{k}": t.clone() for k, t in self.bufs.tensors.items()})
        else:  # the layer as it is (the closed loop's control leaves all but the last unpatched)
            output = type(layer).forward(layer, *args, **kwargs)
            values, stats = {"out": last_position(first_output(output))}, LayerPatchStats()
        result.layer_stats.append(stats)
        if "router" in values and "router" in target.values:  # MoE: did the same experts fire?
            stats.routing_changed = int(set(values["router"][2].tolist()) != set(target.values["router"][2].tolist()))
        result.compare_layer(values["out"], step.record[index])
        return output
