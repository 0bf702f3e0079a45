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
regularized inverse (`lemmas_ls.ridge_ls`): the fit no longer interpolates the fit rows, and moves less in
the directions those rows barely span. The fit itself is fixed_patch.fit_fixed_patch, given the aligned rows
of the batch; the model's parameters are changed in place, `FixedPatch.restore` puts them back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.patching.arch.base import BlockAdapter
from experiments.patching.fixed_patch import FixedPatch, Targets, capture_targets, fit_fixed_patch


@dataclass(frozen=True)
class FitSequence:
    """One fit sequence: the ids with the system prompt and without it (each followed by the reply but its
    last token), and how many positions at their end are aligned."""

    prompted: tuple[int, ...]
    plain: tuple[int, ...]
    aligned: int


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


def fit_patch(model: nn.Module, adapter: BlockAdapter, sequences: list[FitSequence], targets: Targets,
              pad_id: int, rank: int | None = None, ridge: float = 0.0) -> FixedPatch:
    """Fit the fixed patch at every aligned position of `sequences` (module docstring), closed loop, in one
    forward of their batch (fixed_patch.fit_fixed_patch with the aligned rows). The model's parameters are
    changed in place (restore with `.restore(model)`)."""
    ids, rows = plain_batch(sequences, pad_id, next(model.parameters()).device)
    return fit_fixed_patch(model, adapter, ids, targets, rows=rows, rank=rank, ridge=ridge)


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
