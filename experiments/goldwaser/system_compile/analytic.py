"""The analytic way: Table 1's fixed patch fitted by least squares over the positions of MANY sequences.

context_compile fits one fixed weight change per layer at k positions of one reply
(patching/fixed_patch.py: closed loop, in one forward of one sequence). A system prompt is compiled for
queries: the positions are those of every fit query's sequence without the system prompt, aligned with
the same positions of the sequence with it (inputs.py: the shared end of the two inputs, and the reply).
Stacking the N aligned positions of all fit queries as rows, the lemmas are the same least-squares
versions (lemmas_ls.py, the output rules' `fit_positions`):

    input side   ΔW = W (Z_C − Z)ᵀ (Zᵀ)⁺            exact at the N rows while they are independent (N ≤ d),
                                                   the least-squares solution beyond
    output side  the rule of the block (outer weight ΔW′ = Rᵀ (Yᵀ)⁺; a post-norm scale, least squares)

Closed loop over all the sequences at once: they run as one right-padded batch (no attention mask is
needed: a causal model's real positions never see the padding after them), and each hook reads only the
rows of the aligned positions. So layer l + 1 is fitted to what the already patched layers ≤ l produce.
`rank` truncates each fitted matrix to its best rank-r approximation (SVD) before the next layer is fitted,
for a budget like a rank-r LoRA's. `ridge` > 0 replaces the matrices' pseudo-inverse by Tikhonov's
regularized inverse (`ridge_ls`): the fit no longer interpolates the fit rows, and moves less in the directions
those rows barely span. The model's parameters are changed in place; `FixedPatch.restore` puts
them back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.patching.arch.base import CONV1D, OUTER_WEIGHT, BlockAdapter
from experiments.patching.fixed_patch import FixedPatch, LayerFit, Targets, capture_targets
from experiments.patching.lemmas_ls import input_update_ls, relative_residual
from experiments.patching.rules.base import as_rows, module_input


@dataclass(frozen=True)
class FitSequence:
    """One fit sequence: the ids with the system prompt and without it (each followed by the reply but its
    last token), and how many positions at their end are aligned."""

    prompted: tuple[int, ...]
    plain: tuple[int, ...]
    aligned: int


def truncate(delta: Tensor, rank: int | None) -> Tensor:
    """The best rank-`rank` approximation of a matrix (batched over leading dims), or `delta` itself."""
    if rank is None or min(delta.shape[-2:]) <= rank:
        return delta
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    return (U[..., :rank] * S[..., None, :rank]) @ Vh[..., :rank, :]


def ridge_ls(B: Tensor, X: Tensor, ridge: float) -> Tensor:
    """Δ with Δ Xᵀ ≈ B, for B (..., out, N) and rows X (N, n): B (X Xᵀ + λ I)⁻¹ X, λ = ridge · mean_i ‖x_i‖²
    (scale-free); at ridge = 0 the least-squares lemma's B (Xᵀ)⁺."""
    if ridge == 0:
        return B @ torch.linalg.pinv(X.T)
    lam = ridge * float(X.square().sum(-1).mean())
    gram = X @ X.T + lam * torch.eye(X.shape[0], dtype=X.dtype, device=X.device)
    return B @ torch.linalg.solve(gram, X)


def _write(P: Tensor, delta: Tensor) -> None:
    """P ← P + Δ, computed in float64 and rounded once to P's dtype (as fixed_patch.py)."""
    P.copy_((P.double() + delta).to(P.dtype))


def _first(out):
    return out[0] if isinstance(out, tuple) else out


class RowPicker:
    """The rows of a (B, S, …) batch (or of its flattened (B·S, …) form) at the aligned positions."""

    def __init__(self, rows: Tensor, batch: int, length: int):
        self.rows, self.n = rows, batch * length
        self.shape = (batch, length)

    def __call__(self, t: Tensor) -> Tensor:
        return as_rows(t)[self.rows]

    def tensor(self, t):
        """A module argument at the aligned rows, as a (1, N, …) tensor, or as (N, …) when it came flattened."""
        if not isinstance(t, Tensor) or t.dim() == 0:
            return t
        if t.dim() >= 2 and tuple(t.shape[:2]) == self.shape:
            return t.reshape(self.n, *t.shape[2:])[self.rows].unsqueeze(0)
        if t.shape[0] == self.n:
            return t[self.rows]
        return t

    def args(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(self.tensor(a) for a in args), {k: self.tensor(v) for k, v in kwargs.items()}


def _input_side(layer: nn.Module, adapter: BlockAdapter, Z: Tensor, Z_c: Tensor, rank: int | None,
                ridge: float) -> float:
    """ΔW = W (Z_C − Z)ᵀ (Zᵀ)⁺ for every matrix reading z (ridge: regularized; truncated to `rank`); the
    worst relative miss max_i |W′ z_i − W z_C,i| / max |W z_C,i| after rounding."""
    worst = 0.0
    for name, layout in adapter.input_matrices.items():
        P = layer.get_parameter(name)
        W = P.detach().double().clone()
        eff = W.T if layout == CONV1D else W  # Conv1D stores (in, out)
        delta = input_update_ls(eff, Z_c, Z) if ridge == 0 else ridge_ls(eff @ (Z_c - Z).T, Z, ridge)
        delta = truncate(delta, rank)
        _write(P, delta.T if layout == CONV1D else delta)
        new = P.detach().double()
        new_eff = new.T if layout == CONV1D else new
        want, got = eff @ Z_c.T, new_eff @ Z.T
        worst = max(worst, float((got - want).abs().max()) / max(float(want.abs().max()), 1e-300))
    return worst


@torch.no_grad()
def fit_targets(model: nn.Module, adapter: BlockAdapter, sequences: list[FitSequence], device) -> Targets:
    """Per layer, the MLP input z_C and the layer output T_C of the model given the system prompt, at every
    aligned position of every sequence, stacked in the order `fit_patch` reads them."""
    per_layer_z, per_layer_out = None, None
    for s in sequences:
        ids = torch.tensor([s.prompted], device=device)
        _, t = capture_targets(model, adapter, ids, len(s.prompted) - s.aligned, s.aligned)
        if per_layer_z is None:
            per_layer_z, per_layer_out = [[z] for z in t.z], [[o] for o in t.out]
        else:
            for i in range(len(t.z)):
                per_layer_z[i].append(t.z[i])
                per_layer_out[i].append(t.out[i])
    return Targets([torch.cat(z) for z in per_layer_z], [torch.cat(o) for o in per_layer_out])


def plain_batch(sequences: list[FitSequence], pad_id: int, device) -> tuple[Tensor, Tensor]:
    """The sequences without the system prompt as one right-padded batch (B, S), and the flat row index
    (b·S + j) of every aligned position, sequence by sequence: the order of `fit_targets`."""
    length = max(len(s.plain) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    rows = []
    for b, s in enumerate(sequences):
        ids[b, :len(s.plain)] = torch.tensor(s.plain)
        rows.extend(b * length + j for j in range(len(s.plain) - s.aligned, len(s.plain)))
    return ids.to(device), torch.tensor(rows, device=device)


@torch.no_grad()
def fit_patch(model: nn.Module, adapter: BlockAdapter, sequences: list[FitSequence], targets: Targets,
              pad_id: int, rank: int | None = None, ridge: float = 0.0) -> FixedPatch:
    """Fit the fixed patch at every aligned position of `sequences` (module docstring), closed loop, in one
    forward of their batch. The model's parameters are changed in place (restore with `.restore(model)`)."""
    layers = adapter.layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    ids, rows = plain_batch(sequences, pad_id, next(model.parameters()).device)
    pick = RowPicker(rows, *ids.shape)
    patch = FixedPatch(k=len(rows))
    for layer in layers:
        prefix = names[id(layer)]
        for name in (*adapter.input_matrices, adapter.output_param):
            patch.originals[f"{prefix}.{name}"] = layer.get_parameter(name).detach().clone()
    handles = []
    for index, layer in enumerate(layers):
        seen: dict = {}

        def keep_v(_m, a, kw, seen=seen):
            seen["v"] = pick(module_input(a, kw))

        def keep_x(_m, a, kw, seen=seen):
            seen["x"] = module_input(a, kw)

        def keep_attn(_m, _a, o, seen=seen):
            seen["v"] = pick(seen["x"] + _first(o))  # parallel block (Thm 12): v = x + A

        def fit_inputs(_m, a, kw, index=index, layer=layer, seen=seen):
            Z = pick(module_input(a, kw))
            seen["rank"] = int(torch.linalg.matrix_rank(Z))
            seen["input_rel"] = _input_side(layer, adapter, Z, targets.z[index], rank, ridge)

        def fit_output(module, a, kw, index=index, layer=layer, seen=seen):
            P = layer.get_parameter(adapter.output_param)
            G = pick(_first(module.forward(*a, **kw)))  # .forward: no hooks
            R = targets.out[index] - seen["v"] - G
            sub_a, sub_kw = pick.args(a, kw)
            if ridge and adapter.output_rule == OUTER_WEIGHT:  # ΔW′ Yᵀ ≈ Rᵀ, regularized
                delta = ridge_ls(R.T, as_rows(module_input(sub_a, sub_kw)), ridge)
            else:  # the rule's least squares (a vector rule is overdetermined already)
                delta, _ = adapter.rule.fit_positions(adapter, module, P, sub_a, sub_kw, R)
            delta = truncate(delta, rank) if delta.dim() >= 2 else delta
            _write(P, delta)
            moved = pick(_first(module.forward(*a, **kw))) - G  # what the written change really moves
            patch.layers.append(LayerFit(index, seen["rank"], seen["input_rel"], relative_residual(R, moved),
                                         float(R.norm()), float(delta.abs().max())))

        if adapter.residual_at:
            handles.append(layer.get_submodule(adapter.residual_at).register_forward_pre_hook(keep_v, with_kwargs=True))
        else:
            handles.append(layer.register_forward_pre_hook(keep_x, with_kwargs=True))
            handles.append(layer.get_submodule(adapter.attention).register_forward_hook(keep_attn))
        handles.append(layer.get_submodule(adapter.mlp).register_forward_pre_hook(fit_inputs, with_kwargs=True))
        handles.append(adapter.owner(layer).register_forward_pre_hook(fit_output, with_kwargs=True))
    try:
        adapter.decoder(model)(input_ids=ids, use_cache=False)  # the decoder body: no LM head needed
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


def budget(patch: FixedPatch, model: nn.Module, rank: int | None) -> dict[str, float]:
    """What the patch costs: the rank of its matrices (the least-squares form is a product of factors
    through the N fitted rows, so rank ≤ min(N, m, n), or the truncation), the parameters of that factored
    form (rank·(m + n) a matrix, every entry of a vector) and the entries of the merged weights it changed."""
    params = dict(model.named_parameters())
    factored, changed, ranks = 0, 0, []
    for name, original in patch.originals.items():
        changed += int((params[name].detach() != original).sum())
        if original.dim() >= 2:
            m, n = original.shape[-2:]
            r = min(patch.k, m, n, rank if rank is not None else patch.k)
            ranks.append(r)
            factored += r * (m + n) * (original.numel() // (m * n))  # an MoE's stacked experts: each its own
        else:
            factored += original.numel()
    return dict(rank=max(ranks, default=0), params_factored=factored, params_changed=changed)
