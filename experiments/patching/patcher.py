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
- closed_loop: against the hidden state x′ the patched pass actually produced; after the input update
  (rounded) the layer's own forward on x′ gives T′, and the output rule absorbs r = T(C, x) − T′: the
  layer is solved for the exact with-context output, so rounding is fed back, not amplified. In exact
  arithmetic it is the same patch as naive.

Patch arithmetic is float32 (float64 for float64 models); only W + ΔW is rounded, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from experiments.patching import lemmas
from experiments.patching.arch import adapter_for, check_variant
from experiments.patching.arch.base import CONV1D, EXPERTS, MOE, OUTER_BIAS, OUTER_WEIGHT, SCALE, BlockAdapter


class _StopAtMLP(Exception):
    """Raised by a hook once the MLP input is known: the rest of the layer is not needed."""


def _last(t):
    """The query position of a captured tensor ((1, T, d) or (T, k)), or of each tensor of a tuple."""
    if isinstance(t, tuple):
        return tuple(_last(x) for x in t)
    return t.reshape(-1, t.shape[-1])[-1].detach().clone()


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class LayerCapture:
    """One decoder layer's values at the query position: `x_in`, `out`, `v` (or `attn`), `z` and the
    output rule's inputs (`y`, `d`, `h`, `router`), keyed by name."""

    values: dict = field(default_factory=dict)

    x_in = property(lambda self: self.values.get("x_in"))
    x_out = property(lambda self: self.values.get("out"))
    v_c = property(lambda self: self.values.get("v"))
    z_c = property(lambda self: self.values.get("z"))
    d_c = property(lambda self: self.values.get("d"))
    h_gated_c = property(lambda self: self.values.get("h"))


def _module(layer: nn.Module, path: str) -> nn.Module:
    return layer.get_submodule(path)


def register_captures(adapter: BlockAdapter, layer: nn.Module, values: dict, stop_at_mlp: bool = False) -> list:
    """Hooks recording the adapter's values into `values` (query position); `stop_at_mlp` aborts the
    forward once z is known (raises _StopAtMLP)."""
    handles = []

    def keep_input(name: str, stop: bool = False):
        def hook(_m, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            values[name] = _last(x)
            if stop:
                raise _StopAtMLP

        return hook

    def keep_output(name: str):
        def hook(_m, _args, output):
            values[name] = _last(output)

        return hook

    if adapter.residual_at:
        handles.append(_module(layer, adapter.residual_at).register_forward_pre_hook(keep_input("v")))
    else:
        handles.append(_module(layer, adapter.attention).register_forward_hook(keep_output("attn")))
    handles.append(_module(layer, adapter.mlp).register_forward_pre_hook(keep_input("z", stop_at_mlp),
                                                                         with_kwargs=True))
    for name, (path, where) in adapter.captures.items():
        m = _module(layer, path)
        handles.append(m.register_forward_pre_hook(keep_input(name), with_kwargs=True) if where == "input"
                       else m.register_forward_hook(keep_output(name)))
    return handles


def residual(values: dict) -> Tensor:
    """v: read before the MLP, or x + A for a parallel block (Thm 12)."""
    if "v" in values:
        return values["v"]
    return values["x_in"] + _first(values["attn"])


@contextmanager
def capture_context(adapter: BlockAdapter, layers: nn.ModuleList) -> Iterator[list[LayerCapture]]:
    """Record every layer's values at the query position during a with-context forward."""
    caps = [LayerCapture() for _ in layers]
    handles = []

    def keep_in(cap):
        def hook(_m, args, kwargs):
            cap.values["x_in"] = _last(args[0] if args else kwargs["hidden_states"])

        return hook

    def keep_out(cap):
        def hook(_m, _args, _kwargs, output):
            cap.values["out"] = _last(_first(output))

        return hook

    for layer, cap in zip(layers, caps, strict=True):
        handles += [layer.register_forward_pre_hook(keep_in(cap), with_kwargs=True),
                    layer.register_forward_hook(keep_out(cap), with_kwargs=True)]
        handles += register_captures(adapter, layer, cap.values)
    try:
        yield caps
    finally:
        for h in handles:
            h.remove()


# -- patched tensors ---------------------------------------------------------------------------------
@dataclass
class PatchBuffers:
    """One layer's patched tensors (`tensors`, by parameter name relative to the layer) in the model's
    dtype; their storage is reused layer after layer and token after token."""

    dtype: torch.dtype
    tensors: dict[str, Tensor] = field(default_factory=dict)
    _store: dict[str, Tensor] = field(default_factory=dict)
    _scratch: dict[tuple, Tensor] = field(default_factory=dict)

    def begin(self) -> None:
        self.tensors = {}

    def out(self, name: str, like: Tensor) -> Tensor:
        t = self._store.get(name)
        if t is None or t.shape != like.shape or t.device != like.device:
            t = self._store[name] = torch.empty(like.shape, dtype=self.dtype, device=like.device)
        self.tensors[name] = t
        return t

    def scratch(self, like: Tensor, dtype: torch.dtype) -> Tensor:
        key = (tuple(like.shape), dtype, like.device)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return self._scratch[key]

    def in_compute(self, W: Tensor, cdt: torch.dtype) -> Tensor:
        """W itself in the compute dtype, or an exact copy in a reused scratch buffer (overwritable)."""
        return W if W.dtype == cdt else self.scratch(W, cdt).copy_(W)


def add_outer_rounded(W: Tensor, u: Tensor, s: Tensor, out: Tensor, layout: str = "linear") -> None:
    """out = W + ΔW rounded once to out's dtype, ΔW = u sᵀ (linear), its transpose (Conv1D), or
    u_e sᵀ per expert (u (E, out)). W is in the compute dtype (a scratch copy when that is not the model's)."""
    if layout == CONV1D:
        u, s = s, u
    if layout == EXPERTS:
        delta = u.unsqueeze(-1) * s
        if W.dtype == out.dtype:
            torch.add(W, delta, out=out)
        else:
            out.copy_(W.add_(delta))
    elif W.dtype == out.dtype:
        torch.addr(W, u, s, out=out)
    else:
        out.copy_(W.addr_(u, s))  # one rounding, as when the patched checkpoint is saved in its dtype


def input_update_rounded(W: Tensor, layout: str, z_c: Tensor, z: Tensor, bufs: PatchBuffers, name: str,
                         cdt: torch.dtype) -> None:
    """Thms 6–7 on one input matrix in its layout, written rounded into bufs[name]."""
    Wc = bufs.in_compute(W, cdt)
    if layout == CONV1D:  # effective matrix Wᵀ: u = Wᵀ (z_C − z) = (z_C − z) W
        u, s = lemmas.input_update(Wc.T, z_c, z)
    else:  # linear (out, in) or experts (E, out, in): u = W (z_C − z), batched over experts
        u, s = lemmas.input_update(Wc, z_c, z)
    add_outer_rounded(Wc, u, s, bufs.out(name, W), layout)


@dataclass
class LayerPatchStats:
    div_zero: int = 0  # coordinates where a division (Thm 10, App. B) was undefined
    no_root: int = 0  # 1 when App. B's multiplier equation had no root on (−∞, min m²)
    dm_linf: float = 0.0  # max |Δ| of the output parameter (Δm, Δb, or ΔW′'s factor r)
    routing_changed: int = 0  # MoE: 1 when the patched pass picked other experts than the context pass


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


# -- output rules ------------------------------------------------------------------------------------
def apply_output_rule(adapter: BlockAdapter, layer: nn.Module, r: Tensor, values: dict, bufs: PatchBuffers,
                      cdt: torch.dtype, patched_inputs: bool = False) -> LayerPatchStats:
    """Make the outer function's output move by r (Table 1), from the values of the pass the rule reads:
    the with-context pass (naive: unpatched weights) or the patched pass (`patched_inputs`: the input
    matrices as patched in `bufs`)."""
    stats = LayerPatchStats()
    P = layer.get_parameter(adapter.output_param)
    out = bufs.out(adapter.output_param, P)
    if adapter.output_rule == OUTER_BIAS:  # Thm 8
        db = lemmas.outer_bias_update(r)
        out.copy_(P.to(cdt) + db)
        stats.dm_linf = float(db.abs().max())
    elif adapter.output_rule == OUTER_WEIGHT:  # Thm 9
        u, s = lemmas.outer_weight_update(r, values["y"].to(cdt))
        add_outer_rounded(bufs.in_compute(P, cdt), u, s, out)
        stats.dm_linf = float(r.abs().max())
    elif adapter.output_rule == SCALE:  # Thm 10: Gemma's post-MLP RMSNorm, h = d / RMS(d) in float32
        h = _module(layer, adapter.output_param.rsplit(".", 1)[0])._norm(values["d"].float()).to(cdt)
        dm, stats.div_zero = lemmas.scale_update(r, h)
        out.copy_(P.to(cdt) + dm)
        stats.dm_linf = float(dm.abs().max())
    elif adapter.output_rule == MOE:  # Thm 11
        _moe_rule(layer, r, values, bufs, P, out, cdt, patched_inputs)
        stats.dm_linf = float(r.abs().max())
    else:
        raise ValueError(f"unknown output rule {adapter.output_rule!r}")
    return stats


def _moe_rule(layer, r, values, bufs, P, out, cdt, patched_inputs) -> None:
    """Each active expert's W_down,j gets ΔW′_j y_j = r / S, y_j its own input for z (the expert's
    gate_up as that pass used it: patched when the values come from the patched pass)."""
    experts = layer.mlp.experts
    _logits, gates, index = values["router"]
    gate_up = bufs.tensors["mlp.experts.gate_up_proj"] if patched_inputs else experts.gate_up_proj
    z = values["z"]
    ys = []
    for j in index.tolist():  # as MixtralExperts.forward computes an expert's hidden state
        g, u = nn.functional.linear(z, gate_up[j]).chunk(2, dim=-1)
        ys.append((experts.act_fn(g) * u).to(cdt))
    W = bufs.scratch(P, cdt).copy_(P)  # a copy in the compute dtype: the model's weights stay untouched
    for j, (u, s) in zip(index.tolist(), lemmas.moe_updates(r, gates.to(cdt), torch.stack(ys)), strict=True):
        W[j].addr_(u, s)
    out.copy_(W)


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
        # closed_loop: solve the output rule against the layer's own forward with the rounded input update
        # (exact for this layer); False: r = v_C − v(x′) as Algorithm 1, each layer's rounding left to the next
        self.solve_output = True

    # -- the with-context side ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inputs: dict):
        return self.model(**inputs, use_cache=True, logits_to_keep=1).past_key_values

    @torch.no_grad()
    def context_step(self, inputs: dict, cache) -> tuple[Tensor, list[LayerCapture], object]:
        """The with-context forward of the newest token(s) on top of `cache`: (logits, captures, cache)."""
        with capture_context(self.adapter, self.layers) as caps:
            out = self.model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float(), caps, out.past_key_values

    @torch.no_grad()
    def control_logits(self, query: Tensor) -> Tensor:
        """The control: the unpatched model's own forward of the query token alone (no context)."""
        return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].float()

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
        values = {"x_in": _last(hidden)}
        if args:
            args = (hidden, *args[1:])
        else:
            kwargs = dict(kwargs, hidden_states=hidden)
        handles = register_captures(self.adapter, layer, values, stop_at_mlp)
        output = None
        try:
            output = functional_call(layer, params, args, kwargs)
            values["out"] = _last(_first(output))
        except _StopAtMLP:
            pass
        finally:
            for h in handles:
                h.remove()
        return values, output

    def _patch_and_run(self, index, layer, cap, args, kwargs, result, keep):
        hidden = args[0] if args else kwargs["hidden_states"]
        stats = self.patch_layer(layer, cap, hidden, args, kwargs)
        result.layer_stats.append(stats)
        if keep is not None:
            keep.update({f"{self.layer_names[index]}.{k}": t.clone() for k, t in self.bufs.tensors.items()})
        values, output = self._run(layer, args, kwargs, hidden, self.bufs.tensors)
        if "router" in values and "router" in cap.values:  # MoE: did the same experts fire?
            stats.routing_changed = int(set(values["router"][2].tolist()) != set(cap.values["router"][2].tolist()))
        target = cap.x_out.double()
        err = float((values["out"].double() - target).abs().max())
        result.hidden_linf.append(err)
        result.hidden_rel.append(err / max(float(target.abs().max()), 1e-300))
        return output

    def patch_layer(self, layer: nn.Module, cap: LayerCapture, hidden: Tensor, args=(), kwargs=None) -> LayerPatchStats:
        """Fill self.bufs with this layer's patched tensors for the patched pass's input `hidden`."""
        A, cdt, bufs = self.adapter, self.cdt, self.bufs
        kwargs = kwargs or {}
        x_ref = hidden if self.variant == "closed_loop" else cap.x_in.to(hidden.dtype).view_as(hidden)
        bufs.begin()
        alone, _ = self._run(layer, args, kwargs, x_ref, {}, stop_at_mlp=True)  # v and z without context
        z_c, z = cap.z_c.to(cdt), alone["z"].to(cdt)
        for name, layout in A.input_matrices.items():  # Thms 6–7 (+ the router, Thm 11)
            input_update_rounded(layer.get_parameter(name), layout, z_c, z, bufs, name, cdt)
        if self.variant == "closed_loop" and self.solve_output:
            mid, _ = self._run(layer, args, kwargs, x_ref, bufs.tensors)  # T′ with the rounded input update
            r = cap.x_out.to(cdt) - mid["out"].to(cdt)
            return apply_output_rule(A, layer, r, mid, bufs, cdt, patched_inputs=True)
        r = residual(cap.values).to(cdt) - residual(alone).to(cdt)  # v_C − v (Thm 12: A_C − A)
        if self.variant == "stable":
            from experiments.patching.gemma3 import stable_down_and_scale

            return stable_down_and_scale(layer, cap, r, bufs, cdt)
        return apply_output_rule(A, layer, r, cap.values, bufs, cdt)
