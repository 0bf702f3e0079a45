"""Per-token patches on any supported decoder, with the model's own forward doing the patched pass.

For one query token after a context:
1. The with-context pass (KV-cached, as in generation) leaves two things, kept apart (`ContextStep`):
   the targets, per layer and at the query position, what a variant's solver needs (the layer's input x
   and output T(C, x), the residual v_C, the MLP input z_C, the output rule's inputs: `capture_context`);
   and the record, each layer's output recorded by hooks of its own (`record_outputs`), which no solver
   is handed. Every per-layer error (hidden_linf, hidden_rel) is measured against the record, so a solver
   fed wrong targets shows large errors where they were wrong, even one that forces its output to them.
2. The patched pass is the stock model's forward of the query token alone. For an open loop (naive =
   Algorithm 1, stable = App. B, conditioned) every layer's patched tensors are computed first, from the
   targets alone and each layer's call arguments for the query alone (`query_calls`), and then the model's
   own, unmodified forward runs with them in place of its parameters (`functional_call` over the whole
   model): no layer's forward is replaced or intercepted, so nothing the pass did not compute can reach the
   next layer. Each layer's output is read by a forward hook that only copies it (`record_outputs`). The
   closed loop (a construction) keeps its interception: each layer's forward is handed to the variant, which
   solves the layer inside the pass. Embedding, positions, masks, final norm, logit soft-capping: all the
   model's own. Per-layer errors and statistics stay on the device and are read back once per pass
   (`PatchedPass.finish`).

The variants (`variants.py`): the open loop (naive = Algorithm 1, stable = App. B, conditioned) computes
each layer's patch from the with-context pass alone (`open_loop.py`): the paper's method, so its agreement
is evidence. The closed loop (`closed_loop.py`) solves each layer, inside the pass, for the with-context
output itself: exact by design for any targets (the last layer alone suffices: `closed_loop_last`, its
control), so its logit agreement is a construction, not evidence for Theorem 1.

Patch arithmetic is float32 (float64 for float64 models); only W + ΔW is rounded, once. Logits are
compared in float32, or in float64 for a float64 model (float64 end to end).

How a matrix's rank-1 patch reaches the open loop's forward (`apply`): `materialized` writes W + ΔW rounded
to the model's dtype (the paper's reading: a weight update), `action` keeps W and the update's factors and
adds c (vᵀz) to the module's own output, in the model's dtype, by a forward hook on that module (a low-rank
adapter, as in LoRA; `rounded.RankOneAction`). Both are the model's forward of the query alone; in float64
they agree to rounding, in bfloat16 they differ by the rounding of W + ΔW, which the action never forms.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching import alone_batch, layer_stack
from experiments.patching.arch import adapter_for
from experiments.patching.capture import (
    LayerCapture,
    StandIns,
    capture_context,
    first_output,
    last_position,
    record_outputs,
)
from experiments.patching.compare import logit_dtype
from experiments.patching.kinds import MATERIALIZED
from experiments.patching.lemmas import deferred_checks
from experiments.patching.open_loop import fill_all
from experiments.patching.rounded import PatchBuffers, RankOneAction, compute_dtype
from experiments.patching.rules import LayerPatchStats
from experiments.patching.rules.base import module_input
from experiments.patching.taps import attach_post, attach_pre, replace_forward
from experiments.patching.variants import Variant, check_apply, check_variant


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
    # an open loop's: the patched tensors and kept actions the forward ran with (the witness runs them again;
    # they live in buffers reused by the next token), and each layer's output at the query
    tensors: dict[str, Tensor] | None = field(default=None, repr=False)
    actions: dict | None = field(default=None, repr=False)
    outputs: list[Tensor] = field(default_factory=list, repr=False)

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

    _pending: list = field(default_factory=list, repr=False)  # per layer: (err, rel) on the device

    def compare_layer(self, output: Tensor, reference: Tensor) -> None:
        """Queue one layer's error, its output at the query position against the record's, as device
        tensors: nothing is read back until `finish`."""
        ref = reference.double()
        err = (output.double() - ref).abs().max()
        self._pending.append(torch.stack([err, err / ref.abs().max().clamp_min(1e-300)]))

    def finish(self, checks: list[tuple[Tensor, str]] = (), defer: list | None = None) -> PatchedPass:
        """Read the queued per-layer errors, the layers' statistics and the pass's deferred value checks
        (`lemmas.deferred_checks`) back to the host, in one read; a failed check raises its ValueError. With
        `defer` (a list), nothing is read: the values stay on the device, gathered into one vector queued in
        `defer` with what takes them (`read_deferred` reads every queued pass at once, later)."""
        stat_fields = [(s, f) for s in self.layer_stats for f in STAT_FIELDS if isinstance(getattr(s, f), Tensor)]
        parts = ([t for t in self._pending] + [getattr(s, f).detach().double().reshape(1) for s, f in stat_fields]
                 + [flag.double().reshape(1) for flag, _ in checks])
        if not parts:
            return self
        device = parts[0].device
        vector = torch.cat([t.to(device).reshape(-1) for t in parts])
        messages = [message for _, message in checks]
        n = 2 * len(self._pending)
        if defer is not None:
            # compiled (step_graph.py), a pass hands on its values alone: what takes them is the same every token,
            # and the compiled step keeps the one its eager first run made
            defer.append((None if torch.compiler.is_compiling()
                          else functools.partial(self._take, stat_fields, messages, n), vector))
            return self
        return self._take(stat_fields, messages, n, vector.tolist())

    def _take(self, stat_fields: list, messages: list[str], n: int, values: list[float]) -> PatchedPass:
        """The read values into the pass: `n` error values (two a layer), the statistics, the checks (the first
        failed one raises). A recorded pass (step_graph.py) takes each replay's values in turn."""
        failed = [message for message, v in zip(messages, values[len(values) - len(messages):], strict=True) if v]
        if failed:
            raise ValueError(failed[0])
        self.hidden_linf.extend(values[0:n:2])
        self.hidden_rel.extend(values[1:n:2])
        for (stats, name), value in zip(stat_fields, values[n:n + len(stat_fields)], strict=True):
            setattr(stats, name, value if name == "dm_linf" else int(value))
        self._pending = []
        return self


STAT_FIELDS = ("div_zero", "no_root", "dm_linf", "routing_changed")


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


def routing_changed(router, target: LayerCapture) -> Tensor:
    """MoE: 1 where the patched pass's router picked other experts than the with-context pass (a device
    tensor: read with the pass's other statistics)."""
    picked, wanted = router[2].reshape(-1), target.values["router"][2].reshape(-1)
    if picked.numel() != wanted.numel():
        return torch.ones((), dtype=torch.int64, device=picked.device)
    return (picked.sort().values != wanted.sort().values).any().to(torch.int64)


def register_router_capture(adapter, layer: nn.Module, values: dict):
    """A read-only forward hook keeping an MoE router's output at the query position into `values`."""
    path, where = adapter.captures["router"]

    def hook(_m, _args, output):
        values["router"] = last_position(output)

    if where == "input":
        raise ValueError(f"{adapter.family}: the router capture must be a module output")
    return attach_post(layer.get_submodule(path), hook)


@contextmanager
def applied_actions(model: nn.Module, actions: dict[str, RankOneAction]):
    """Inside the block, `model`'s forward (and any of its layers run alone) adds the kept actions
    (apply=action; none: the model as it is)."""
    handles = register_actions(model, actions)
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


def register_actions(model: nn.Module, actions: dict[str, RankOneAction]) -> list:
    """apply=action: a forward hook on each patched matrix's module that adds its kept update's action to
    the module's own output (the module computes W·z itself, from its unchanged W)."""
    handles = []
    for name, action in actions.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])

        def hook(_m, args, output, action=action, conv1d=type(module).__name__ == "Conv1D"):
            return output + action.correction(args[0], conv1d)

        handles.append(attach_post(module, hook))
    return handles


# -- the patcher -------------------------------------------------------------------------------------
class Patcher:
    """Per-token patches for any supported transformers causal LM (see `arch/` and `variants.py`)."""

    def __init__(self, model: nn.Module, variant: str = "naive", apply: str = MATERIALIZED,
                 batch_layers: str = "off"):
        self.model = model
        self.adapter = adapter_for(model.config.model_type)
        self.variant: Variant = check_variant(self.adapter, variant)
        self.apply = check_apply(self.adapter, self.variant, apply)
        self.lm = self.adapter.decoder(model)
        # the cache's keyword of each, asked once here (not in a compiled step: `inspect` is no graph's business)
        self.model_cache, self.lm_cache = _cache_name(model), _cache_name(self.lm)
        self.text_config = self.lm.config
        self.layers = self.adapter.layers(model)
        self.dtype = next(self.lm.parameters()).dtype
        self.cdt = compute_dtype(self.dtype)
        self.logit_dtype = logit_dtype(self.dtype)
        self.bufs = PatchBuffers(dtype=self.dtype)  # the layer being patched (the closed loop: one at a time)
        # the open loop holds every layer's patched tensors at once, each layer's in its own buffers
        self.layer_bufs = [PatchBuffers(dtype=self.dtype, apply=self.apply) for _ in self.layers]
        self.stand_ins = StandIns()  # the MLP's kept outputs, for the open loop's alone pass (capture.py)
        self._calls: dict = {}  # (query length, device) -> each layer's call arguments for the query alone
        self._deferred: list = []  # patched passes' values left on the device (patched_pass(defer=True))
        self._mask = self._whole_query_mask()  # the query-alone pass's attention mask, where the model takes it
        # batch_layers: an open loop's input matrices patched in all layers at once, from stacked weights
        # (layer_stack.py; `auto` on a GPU). The stacking moves the model's own parameters, once, here.
        self.layer_stack = layer_stack.stack_for(batch_layers, self.variant, self.adapter, self.layers)
        # batch_layers=on (auto on a GPU): the alone passes too, one vmap a group of alike layers (alone_batch.py)
        self.alone_batch = alone_batch.batch_for(batch_layers, self.variant, self.adapter, self.layers,
                                                 self.layer_stack is not None)
        names = {id(m): n for n, m in model.named_modules()}
        self.layer_names = [names[id(layer)] for layer in self.layers]
        self._inside = False

    def unstack(self) -> None:
        """Every tensor `batch_layers` moved into a stack in its own storage again, same values (what safetensors
        needs to save the model); the patcher then runs its layers one at a time."""
        alone_batch.unstack(self.alone_batch)
        layer_stack.unstack(self.layer_stack)
        self.alone_batch = self.layer_stack = None

    @property
    def batched(self) -> bool:
        """Whether the open loop runs its layers at once (`batch_layers`): input updates stacked, alone passes
        grouped, or both."""
        return self.layer_stack is not None or self.alone_batch is not None

    # -- the with-context side ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inputs: dict, cache=None, **kwargs):
        """The with-context cache of `inputs` (a fresh dynamic one, or filled into `cache`, e.g. a static one)."""
        name = self.model_cache
        given = {} if cache is None else {name: cache}
        return getattr(self.model(**inputs, **given, use_cache=True, logits_to_keep=1, **kwargs), name)

    @staticmethod
    def prompt_prefix(inputs: dict) -> dict:
        """Every prompt token but the last, the first query: per-token inputs (ids, mask, token types) lose their
        last position; the rest (an image's pixels) stays whole."""
        return {k: (v[:, :-1] if k in ("input_ids", "attention_mask", "token_type_ids") else v)
                for k, v in inputs.items()}

    def start(self, inputs: dict) -> tuple[object, Tensor]:
        """Where every comparison starts: the with-context cache of every prompt token but the last (None for
        a one-token prompt, `prompt_prefix`), and that last token, the first query."""
        ids = inputs["input_ids"]
        return (self.prefill(self.prompt_prefix(inputs)) if ids.shape[1] > 1 else None), ids[:, -1:]

    @torch.no_grad()
    def context_step(self, inputs: dict, cache, logits: bool = True) -> ContextStep:
        """The with-context forward of the newest token(s) on top of `cache`. `logits=False` runs the decoder
        body alone (no final norm, no LM head: logits None), for when only the per-layer targets are needed;
        the targets and the record are the same bits."""
        with capture_context(self.adapter, self.layers) as targets, record_outputs(self.layers) as record:
            if not logits:
                name = self.lm_cache
                cache = getattr(self.lm(**inputs, **{name: cache}, use_cache=True), name)
                return ContextStep(None, targets, record, cache)
            name = self.model_cache
            out = self.model(**inputs, **{name: cache}, use_cache=True, logits_to_keep=1)
        return ContextStep(out.logits[0, -1].to(self.logit_dtype), targets, record, getattr(out, name))

    @torch.no_grad()
    def _whole_query_mask(self) -> Tensor | None:
        """The attention mask of a pass of the query token alone, as a 4-D boolean (1, 1, 1, 1) of True, where the
        model takes one and gives the same bits with it: given whole, transformers' mask builders return it as it
        is (masking_utils' early exit), where without one they inspect the positions for packed sequences and the
        padding with `.all()`, a read back to the host every token (two a pass on Gemma 3). Softmax over the one
        key is exactly 1 with or without a mask, so the bits stay; a family that reads positions from the mask
        (OPT's learned positions, from its cumulative sum) refuses it, and then no mask is given (None). Asked of
        the model once, here, by two forwards of one token."""
        device = next(self.model.parameters()).device
        mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
        probe = torch.ones(1, 1, dtype=torch.long, device=device)
        try:
            same = torch.equal(self.model(input_ids=probe, use_cache=False).logits,
                               self.model(input_ids=probe, attention_mask=mask, use_cache=False).logits)
        except (ValueError, RuntimeError, TypeError, IndexError):
            return None
        return mask if same else None

    def query_mask(self) -> dict:
        """The query-alone pass's mask argument: `{"attention_mask": the whole mask}`, or none (`_whole_query_mask`)."""
        return {} if self._mask is None else {"attention_mask": self._mask}

    def read_deferred(self) -> None:
        """Every deferred patched pass's values (`patched_pass(defer=True)`) read back in one read and put into
        their passes; the first failed value check among them raises its ValueError."""
        if not self._deferred:
            return
        queued, self._deferred = self._deferred, []
        values = torch.cat([vector for _, vector in queued]).tolist()
        start = 0
        for take, vector in queued:
            take(values[start:start + vector.numel()])
            start += vector.numel()

    @torch.no_grad()
    def control_logits(self, query: Tensor) -> Tensor:
        """The control: the unpatched model's own forward of the query token alone (no context)."""
        return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].to(self.logit_dtype)

    @torch.no_grad()
    def control_pass(self, query: Tensor, record: list[Tensor]) -> PatchedPass:
        """The control with its per-layer errors: the unpatched model on the query alone, each layer's output
        against the with-context record. It shows how far the record is from what no patch gives, so that
        a patched pass close to the record is not close by accident. It also records each layer's call
        arguments for the query alone (`query_calls`)."""
        with record_outputs(self.layers) as outputs, self._recording_calls(query) as calls:
            logits = self.control_logits(query)
        self._calls[self._calls_key(query)] = calls
        result = PatchedPass(logits=logits, hidden_linf=[], hidden_rel=[])
        for output, reference in zip(outputs, record, strict=True):
            result.compare_layer(output, reference)
        return result.finish()

    @staticmethod
    def _calls_key(query: Tensor) -> tuple:
        return query.shape[-1], query.device

    @contextmanager
    def _recording_calls(self, query: Tensor):
        calls: list = [None] * len(self.layers)

        def keep(index: int):
            def hook(_m, args, kwargs):
                calls[index] = (args, dict(kwargs))

            return hook

        handles = [attach_pre(layer, keep(i), with_kwargs=True) for i, layer in enumerate(self.layers)]
        try:
            yield calls
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def query_calls(self, query: Tensor) -> list[tuple[tuple, dict]]:
        """Each layer's call arguments (positions, masks, rotary tables) in the unpatched forward of the query
        alone, as its forward pre-hooks saw them. With no cache and the query at position 0 they do not depend
        on the token, only on the query's length: recorded once (by the control pass, or by a forward of the
        decoder body here) and reused. The hidden state among them is never used: the open loop runs each
        layer on the with-context input x_{l−1}."""
        key = self._calls_key(query)
        if key not in self._calls:
            with self._recording_calls(query) as calls:
                self.lm(input_ids=query.view(1, -1), use_cache=False)
            self._calls[key] = calls
        return self._calls[key]

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
                     variant: Variant | None = None, defer: bool | list = False) -> PatchedPass:
        """The model's forward of the query token alone with every layer patched by `variant` (the patcher's
        own by default) from `step.targets`, each layer's output compared with `step.record`. An open loop:
        all patches first, then the stock forward with them (`open_loop_pass`); a closed loop: each layer
        solved inside the pass. With `keep`, the patched tensors are also copied into it under their full
        parameter names. With `defer`, the pass reads nothing back to the host: its errors, statistics and
        value checks wait on the device for `read_deferred` (its logits are there at once), or in the list
        `defer` is (a recorded step's own)."""
        variant = variant or self.variant
        into = defer if isinstance(defer, list) else self._deferred if defer else None
        if variant.evidence:
            return self.open_loop_pass(query, step, keep, variant, into)
        result = PatchedPass(logits=None, hidden_linf=[], hidden_rel=[])
        replaced = []
        try:
            for index, layer in enumerate(self.layers):
                replaced.append(replace_forward(layer, self._intercept(variant, index, layer, step, result, keep)))
            with deferred_checks() as checks:
                out = self.model(input_ids=query.view(1, 1), use_cache=False, **self.query_mask())
        finally:
            for forward in replaced:
                forward.remove()
        result.logits = out.logits[0, -1].to(self.logit_dtype)
        return result.finish(checks, into)

    @torch.no_grad()
    def open_loop_tensors(self, query: Tensor, step: ContextStep, variant: Variant | None = None
                          ) -> tuple[dict[str, Tensor], list[LayerPatchStats]]:
        """Every layer's patched tensors (full parameter names), computed before any patched forward from the
        with-context targets alone and each layer's call arguments for the query alone; and their stats.
        Each layer's tensors live in its own buffers (`layer_bufs`), reused token after token: what this
        holds beyond the model is the patched matrices themselves. With apply=action the matrices' updates
        are kept as factors instead (`open_loop_actions` gives them)."""
        variant = variant or self.variant
        calls = self.query_calls(query)
        if self.batched:
            stats = fill_all(self, step.targets, calls, self.layer_stack, variant.output_step(), self.alone_batch)
        else:
            stats = []
            for index, (layer, (args, kwargs)) in enumerate(zip(self.layers, calls, strict=True)):
                self.bufs = self.layer_bufs[index]
                stats.append(variant.fill(self, layer, step.targets[index], module_input(args, kwargs), args, kwargs))
        tensors = {f"{self.layer_names[index]}.{k}": t for index, bufs in enumerate(self.layer_bufs)
                   for k, t in bufs.tensors.items()}
        return tensors, stats

    def open_loop_actions(self) -> dict[str, RankOneAction]:
        """apply=action: every layer's kept rank-1 actions of the last `open_loop_tensors`, by full parameter
        name (empty when materialized)."""
        return {f"{self.layer_names[index]}.{k}": a for index, bufs in enumerate(self.layer_bufs)
                for k, a in bufs.actions.items()}

    def open_loop_pass(self, query: Tensor, step: ContextStep, keep: dict | None, variant: Variant,
                       defer: list | None = None) -> PatchedPass:
        """The open loop's patched pass: the patched tensors of all layers computed first, then the model's
        unmodified forward of the query alone with them in place of its parameters. Forward hooks only copy
        what each layer returns to the next (and an MoE's routing), for the per-layer errors."""
        with deferred_checks() as checks:
            tensors, stats = self.open_loop_tensors(query, step, variant)
        if keep is not None:
            keep.update({name: t.clone() for name, t in tensors.items()})
        routed = "router" in self.adapter.captures
        routes: list[dict] = [{} for _ in self.layers]
        handles = [register_router_capture(self.adapter, layer, routes[i]) for i, layer in enumerate(self.layers)
                   if routed]
        handles += register_actions(self.model, self.open_loop_actions())
        try:
            with record_outputs(self.layers) as outputs:
                out = functional_call(self.model, tensors, (), {"input_ids": query.view(1, 1), "use_cache": False,
                                                                **self.query_mask()})
        finally:
            for h in handles:
                h.remove()
        result = PatchedPass(logits=out.logits[0, -1].to(self.logit_dtype), hidden_linf=[], hidden_rel=[],
                             layer_stats=stats, tensors=tensors, actions=self.open_loop_actions(),
                             outputs=list(outputs))
        for index, (output, reference) in enumerate(zip(outputs, step.record, strict=True)):
            if routed:
                stats[index].routing_changed = routing_changed(routes[index]["router"], step.targets[index])
            result.compare_layer(output, reference)
        return result.finish(checks, defer)

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
            stats.routing_changed = routing_changed(values["router"], target)
        result.compare_layer(values["out"], step.record[index])
        return output
