"""The fixed patch: one weight change per layer, fitted at k positions, that stands in for a prompt.

Goldwaser et al. (§6) patch every generated token anew. Here ONE change of the same parameters is fitted
from k positions of the with-context model's own (teacher-forced) generation, and then kept for every
later token. The model without context reads the sequence s = [start] + reply (no prompt); its position
i is aligned with the with-context position P − 1 + i (both predict reply token i).

Per layer, at the k fitted positions (rows i = 1..k), the with-context pass gives the MLP inputs Z_C
(k × d) and the layer outputs T_C (k × d); the no-context pass gives Z, the residual V before the MLP (or
x + A for a parallel block) and the outer function's inputs. Table 1's rank-1 updates become their
least-squares, rank-≤k versions:

Input side (every matrix W that reads z, Thms 6–7; an MoE's router and experts included). Wanted:
(W + ΔW) z_i = W z_C,i for all i, i.e. ΔW Zᵀ = W (Z_C − Z)ᵀ. The minimum-norm solution

        ΔW = W (Z_C − Z)ᵀ (Zᵀ)⁺                                                   rank ≤ k

is exact when the k vectors z_i are linearly independent ((Zᵀ)⁺ Zᵀ = I_k): it needs k ≤ d. With k = 1,
(zᵀ)⁺ = zᵀ / ‖z‖² and this is Thm 6's update.

Output side: after the input update the MLP's outer function would give g_i; the layer must output
T_C,i = v_i + g_i + r_i, so the outer parameter must move g by R = T_C − V − G (k × d):
  outer weight (Thm 9)   ΔW′ Yᵀ = Rᵀ, Y (k × n) the outer matrix's inputs:  ΔW′ = Rᵀ (Yᵀ)⁺, exact for
                         independent y_i (k ≤ n); k = 1 is Thm 9's r yᵀ / ‖y‖².
  MoE (Thm 11)           g_i = Σ_e a_ie W′_e y_ie (a_ie the router weight, 0 for experts not picked):
                         stacked [ΔW′_1 … ΔW′_E] Φᵀ = Rᵀ with Φ_i = [a_i1 y_i1, …, a_iE y_iE], so
                         [ΔW′_e] = Rᵀ (Φᵀ)⁺: exact when the Φ_i are independent (k ≤ E·n).
  outer bias (Thm 8)     one Δb for all k rows: least squares Δb = mean_i r_i; residual R − 1 Δbᵀ.
  scale (Thm 10)         g = h ⊙ m: per coordinate j, Δm_j = Σ_i h_ij r_ij / Σ_i h_ij²; residual
                         R − H ⊙ Δm. A bias or a scale has d parameters for k·d equations: exact only
                         for k = 1 (and where h_ij ≠ 0); otherwise its least-squares residual is reported.

Closed loop: the whole fit is ONE forward of the no-context sequence with hooks. Layer l's MLP pre-hook
sees the Z that the already patched layers < l really produced and writes W + ΔW (rounded once to the
model's dtype) into the parameters before the MLP reads them; the pre-hook of the module that owns the
output parameter then sees the Y (or H, or the routing) that the patched input maps really give and
solves for R against them. So layer l + 1 is fitted to the hidden states of the patched layers before
it, rounding included. Algebra in float64; the model's parameters are changed in place (`FixedPatch`
keeps the originals to restore). Many sequences fit at once as one right-padded batch, the hooks reading
only the fitted rows (system_compile); a rank cap or a ridge turns the lemmas into their truncated or
regularized versions there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.patching.arch.base import CONV1D, EXPERTS, BlockAdapter
from experiments.patching.compare import comparable
from experiments.patching.lemmas_ls import input_update_ls, relative_residual, ridge_ls, truncate
from experiments.patching.rules.base import as_rows as _rows
from experiments.patching.rules.base import module_input as _hidden


# -- what the with-context pass gives -----------------------------------------------------------------
@dataclass
class Targets:
    """Per layer, at the aligned positions: the MLP input z_C and the layer output T_C (rows = positions)."""

    z: list[Tensor]
    out: list[Tensor]

    def first(self, k: int) -> Targets:
        return Targets([t[:k] for t in self.z], [t[:k] for t in self.out])


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def capture_targets(model: nn.Module, adapter: BlockAdapter, input_ids: Tensor, start: int,
                    count: int) -> tuple[Tensor, Targets]:
    """One forward of `input_ids` (the prompt and the reply): the logits (compare.comparable: float64 for a float64
    model) from position `start` on, and each layer's MLP input and output at the positions start .. start + count
    − 1."""
    layers = adapter.layers(model)
    z: list[Tensor | None] = [None] * len(layers)
    out: list[Tensor | None] = [None] * len(layers)
    handles = []
    for index, layer in enumerate(layers):
        def keep_z(_m, a, kw, i=index):
            z[i] = _rows(_hidden(a, kw))[start:start + count]

        def keep_out(_m, _a, _kw, o, i=index):
            out[i] = _rows(_first(o))[start:start + count]

        handles.append(layer.get_submodule(adapter.mlp).register_forward_pre_hook(keep_z, with_kwargs=True))
        handles.append(layer.register_forward_hook(keep_out, with_kwargs=True))
    try:
        keep = input_ids.shape[1] - start  # the LM head only where the reference is read
        logits = comparable(model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits[0])
    finally:
        for h in handles:
            h.remove()
    return logits, Targets(z, out)


@torch.no_grad()
def layer_outputs(model: nn.Module, adapter: BlockAdapter, input_ids: Tensor) -> tuple[Tensor, list[Tensor]]:
    """A stock forward of `input_ids` (nothing changed in it): (logits (S, V) as compare.comparable gives them,
    each layer's output)."""
    layers = adapter.layers(model)
    outs: list[Tensor | None] = [None] * len(layers)
    handles = [layer.register_forward_hook(lambda _m, _a, o, i=i: outs.__setitem__(i, _rows(_first(o))))
               for i, layer in enumerate(layers)]
    try:
        logits = comparable(model(input_ids=input_ids, use_cache=False).logits[0])
    finally:
        for h in handles:
            h.remove()
    return logits, outs


# -- the fit ------------------------------------------------------------------------------------------
@dataclass
class LayerFit:
    layer: int
    rank: int  # rank of Z at the k positions: the input update is exact when it is k
    input_rel: float  # max over input maps of max_i |W′ z_i − W z_C,i| / max |W z_C,i| (after rounding)
    output_residual: float  # ‖R − fitted‖_F / ‖R‖_F of the output rule (float64, before rounding)
    r_norm: float  # ‖R‖_F: how much the output side had to move
    output_delta_linf: float  # max |Δ| of the output parameter (a scale's Δm = r ⊘ h blows up where h is small)


@dataclass
class FixedPatch:
    """The fitted parameters (already written into the model) and the originals, by full parameter name."""

    k: int
    originals: dict[str, Tensor] = field(default_factory=dict)
    layers: list[LayerFit] = field(default_factory=list)

    @torch.no_grad()
    def restore(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        for name, original in self.originals.items():
            params[name].copy_(original)

    @torch.no_grad()
    def scaled(self, model: nn.Module, factor: float) -> dict[str, Tensor]:
        """Write W + factor·ΔW into the model (the perturbed control); returns the fitted tensors to put back."""
        params = dict(model.named_parameters())
        fitted = {}
        for name, original in self.originals.items():
            p = params[name]
            fitted[name] = p.detach().clone()
            p.copy_((original.double() + factor * (p.double() - original.double())).to(p.dtype))
        return fitted


def _write(P: Tensor, delta: Tensor) -> None:
    """P ← P + Δ, computed in float64 and rounded once to P's dtype."""
    P.copy_((P.double() + delta).to(P.dtype))


class RowPicker:
    """The rows of a (B, S, …) batch (or of its flattened (B·S, …) form) at the fitted positions; all of
    them when `rows` is None (one sequence whose every position is fitted)."""

    def __init__(self, rows: Tensor | None, batch: int, length: int):
        self.n, self.shape = batch * length, (batch, length)
        self.rows = torch.arange(self.n) if rows is None else rows

    def __call__(self, t: Tensor) -> Tensor:
        return _rows(t)[self.rows]

    def tensor(self, t):
        """A module argument at the fitted rows, as a (1, N, …) tensor, or as (N, …) when it came flattened."""
        if not isinstance(t, Tensor) or t.dim() == 0:
            return t
        if t.dim() >= 2 and tuple(t.shape[:2]) == self.shape:
            return t.reshape(self.n, *t.shape[2:])[self.rows].unsqueeze(0)
        if t.shape[0] == self.n:
            return t[self.rows]
        return t

    def args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.tensor(a) for a in args), {k: self.tensor(v) for k, v in kwargs.items()}


def _input_side(layer: nn.Module, adapter: BlockAdapter, Z: Tensor, Z_c: Tensor, rank: int | None = None,
                ridge: float = 0.0) -> float:
    """Every input matrix gets ΔW = W (Z_C − Z)ᵀ (Zᵀ)⁺ (ridge > 0: regularized; truncated to `rank`);
    returns the worst relative miss max_i |W′ z_i − W z_C,i| / max |W z_C,i| after rounding."""
    worst = 0.0
    for name, layout in adapter.input_matrices.items():
        P = layer.get_parameter(name)
        W = P.detach().double().clone()  # .double() of a float64 P is P itself, which _write changes
        eff = W.T if layout == CONV1D else W  # Conv1D stores (in, out)
        delta = input_update_ls(eff, Z_c, Z) if ridge == 0 else ridge_ls(eff @ (Z_c - Z).T, Z, ridge)
        delta = truncate(delta, rank)
        _write(P, delta.T if layout == CONV1D else delta)
        new = P.detach().double()
        new_eff = new.T if layout == CONV1D else new
        want, got = eff @ Z_c.T, new_eff @ Z.T
        worst = max(worst, float((got - want).abs().max()) / max(float(want.abs().max()), 1e-300))
    return worst


def _output_side(adapter: BlockAdapter, module: nn.Module, P: Tensor, args: tuple, kwargs: dict, pick: RowPicker,
                 R_of_g, rank: int | None, ridge: float) -> tuple[float, float, float]:
    """Solve the output rule for R = T_C − V − G (G: `module`'s output with its original parameter) and write
    the change into P; returns (relative least-squares residual, ‖R‖_F, max |Δ|). The residual is the
    rule's own (float64, before rounding), or, where ridge or rank altered its solution, what the written
    change really moves in a forward."""
    G = pick(_first(module.forward(*args, **kwargs)))  # .forward: no hooks
    R = R_of_g(G)
    sub_args, sub_kwargs = pick.args(args, kwargs)
    if ridge and adapter.rule.takes_ridge:  # ΔW′ Yᵀ ≈ Rᵀ, regularized
        delta, fitted = ridge_ls(R.T, _rows(_hidden(sub_args, sub_kwargs)), ridge), None
    else:  # the rule's least squares (a vector rule is overdetermined already)
        delta, fitted = adapter.rule.fit_positions(adapter, module, P, sub_args, sub_kwargs, R)
    if rank is not None and delta.dim() >= 2:
        delta, fitted = truncate(delta, rank), None
    _write(P, delta)
    if fitted is None:
        fitted = pick(_first(module.forward(*args, **kwargs))) - G
    return relative_residual(R, fitted), float(R.norm()), float(delta.abs().max())


@torch.no_grad()
def fit_fixed_patch(model: nn.Module, adapter: BlockAdapter, input_ids: Tensor, targets: Targets,
                    rows: Tensor | None = None, rank: int | None = None, ridge: float = 0.0) -> FixedPatch:
    """Fit the fixed patch at the positions of `input_ids` (B, S), closed loop, in one forward (module
    docstring). `rows`: the flat indices (b·S + j) of the fitted positions, in the order of the targets'
    rows (None: every position of a single sequence, context_compile's first k); a right-padded batch needs no
    attention mask, since a causal model's real positions never see the padding after them. `rank`
    truncates every fitted matrix to its best rank-r approximation before the next layer is fitted;
    `ridge` > 0 replaces the pseudo-inverse by Tikhonov's regularized inverse (lemmas_ls.ridge_ls). The
    model's parameters are changed in place (restore with `.restore(model)`)."""
    check_fixed_patch(adapter)
    layers = adapter.layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    pick = RowPicker(rows, *input_ids.shape)
    patch = FixedPatch(k=len(pick.rows))
    for layer in layers:
        prefix = names[id(layer)]
        for name in (*adapter.input_matrices, adapter.output_param):
            patch.originals[f"{prefix}.{name}"] = layer.get_parameter(name).detach().clone()
    handles = []
    for index, layer in enumerate(layers):
        seen: dict = {}

        def keep_v(_m, a, kw, seen=seen):
            seen["v"] = pick(_hidden(a, kw))

        def keep_x(_m, a, kw, seen=seen):
            seen["x"] = _hidden(a, kw)

        def keep_attn(_m, _a, o, seen=seen):
            seen["v"] = pick(seen["x"] + _first(o))  # parallel block (Thm 12): v = x + A

        def fit_inputs(_m, a, kw, index=index, layer=layer, seen=seen):
            Z = pick(_hidden(a, kw))
            seen["rank"] = int(torch.linalg.matrix_rank(Z))
            seen["input_rel"] = _input_side(layer, adapter, Z, targets.z[index], rank, ridge)

        def fit_output(module, a, kw, index=index, layer=layer, seen=seen):
            P = layer.get_parameter(adapter.output_param)
            res, rn, dl = _output_side(adapter, module, P, a, kw, pick,
                                       lambda G: targets.out[index] - seen["v"] - G, rank, ridge)
            patch.layers.append(LayerFit(index, seen["rank"], seen["input_rel"], res, rn, dl))

        if adapter.residual_at:
            handles.append(layer.get_submodule(adapter.residual_at).register_forward_pre_hook(keep_v, with_kwargs=True))
        else:
            handles.append(layer.register_forward_pre_hook(keep_x, with_kwargs=True))
            handles.append(layer.get_submodule(adapter.attention).register_forward_hook(keep_attn))
        handles.append(layer.get_submodule(adapter.mlp).register_forward_pre_hook(fit_inputs, with_kwargs=True))
        handles.append(adapter.owner(layer).register_forward_pre_hook(fit_output, with_kwargs=True))
    try:
        adapter.decoder(model)(input_ids=input_ids, use_cache=False)  # the decoder body: no LM head needed
    except BaseException:
        patch.restore(model)
        raise
    finally:
        for h in handles:
            h.remove()
    if len(patch.layers) != len(layers):  # a hook that never ran: the adapter does not match this block
        patch.restore(model)
        raise RuntimeError(f"{adapter.family}: fitted {len(patch.layers)} of {len(layers)} layers")
    return patch


def check_fixed_patch(adapter: BlockAdapter) -> None:
    """One line when the fit cannot take the block: it fits every input matrix in the MLP's pre-hook, from
    the MLP's inputs Z, and matrices that read their own inputs beside the MLP (Gemma 4's router and
    experts) would be fitted to the wrong vectors."""
    from experiments.core.errors import UserError

    if adapter.input_at:
        raise UserError(f"the fixed patch fits every input matrix from the MLP's inputs, and in {adapter.family} "
                        f"{', '.join(adapter.input_at)} read their own inputs beside the MLP; patch it per token "
                        "(patch_match variant=naive)")


def rank_limit(config, adapter: BlockAdapter) -> int:
    """The most positions the input update can fit exactly: z has d = hidden size coordinates (and an
    outer matrix's input n ≥ d coordinates in every supported block)."""
    text = config.get_text_config()
    return int(getattr(text, "hidden_size", None) or text.n_embd)


__all__ = ["EXPERTS", "FixedPatch", "LayerFit", "RowPicker", "Targets", "capture_targets",
           "check_fixed_patch", "fit_fixed_patch", "layer_outputs", "rank_limit"]
