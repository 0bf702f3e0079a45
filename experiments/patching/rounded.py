"""Patched tensors W + ΔW, computed in the compute dtype and rounded once to the model's dtype, in buffers
reused layer after layer and token after token.

Every rank-1 update here is ΔW = c vᵀ over the rows of W's storage, where row i's coefficient c_i may
depend on that row itself (the input update's c_i = W_i · (z_C − z); the closed loop's outer-weight
solve, c_i = t_i − W_i · y). `add_rank1_by_rows` walks W in blocks: on the CPU of about 2 MiB, read from
memory once, used for its coefficients and for W + c vᵀ while still in cache, and written rounded into the
output buffer; on a GPU of up to 64 MiB (a 1B model's matrix whole, Gemma 3 27B's in seven).
The open loop also hands it a stack of every layer's copy of one matrix (W (L, rows, n), one v per layer:
`layer_stack.py`), so one call patches that matrix in all layers (issue 54).

A matrix patched alone or in a stack gets the same bits: its coefficients come from the same row blocks
(`row_dot`: MKL's matrix-vector product on the CPU, whose bits can change with the rows it is handed, so the
blocks are the same rows either way; a row's own product and sum elsewhere), and W + c vᵀ is elementwise
(`torch.addr` on the CPU, `torch.addcmul` elsewhere), computed in the compute dtype and rounded once to out's
dtype. On the CPU a matrix patched alone gets the bits it got before stacks existed.
A bfloat16 W is never copied whole to float32: on the CPU a block at a time (in cache), on a GPU not at all
(the kernels read bfloat16 and compute in float32 themselves: two bytes read and two written an element).
(Spreading blocks over Python threads measured slower inside a model's forward.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from experiments.patching import lemmas
from experiments.patching.kinds import ACTION, CONV1D, EXPERTS, EXPERTS_IN_OUT, MATERIALIZED

CPU_BLOCK_BYTES = 1 << 21  # a row block in the compute dtype: stays in cache between its two uses
GPU_BLOCK_BYTES = 1 << 26  # a 1B model's matrix whole (two layers' in a stack); bounds the float32 products

# c: (rows,) for one matrix, (G, rows) for a stack; or a function of a block of W's rows, (k, r, n) in W's dtype,
# its (groups, rows) slices and their slot (k, r) in the coefficient vector, that returns their coefficients in
# the compute dtype, written into the slot where it can (one copy fewer a block)
Coefficients = Tensor | Callable[[Tensor, slice, slice, Tensor], Tensor]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Patch arithmetic is float32, float64 for float64 models."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cpu_kernels(w: Tensor, cdt: torch.dtype) -> bool:
    """Whether a block takes the CPU's kernels (MKL's `mv`, `addr`, group by group): on the CPU, in the compute
    dtype. Otherwise the kernels that read any dtype and do not depend on the block's shape (a GPU's)."""
    return w.device.type == "cpu" and w.dtype == cdt


def row_dot(w: Tensor, x: Tensor, cdt: torch.dtype, out: Tensor | None = None) -> Tensor:
    """w_i · x_g for every row of a block w (k, r, n), x (k, n) one vector per group, in `cdt` (into `out`, (k, r)).
    On the CPU, MKL's matrix-vector product group by group (at a 270M MLP matrix's 2 MiB blocks 0.12–0.18 ms
    against 0.26–0.30 for a product and a sum); the blocks are the same rows whether a matrix is patched alone or
    in a stack, so the bits are too. Elsewhere (or for a block still in another dtype) each row's own products
    and sum, whose bits do not depend on how many rows or groups the block has, and which a GPU's kernels
    compute from bfloat16 without a float32 copy."""
    if _cpu_kernels(w, cdt):
        out = torch.empty(w.shape[:2], dtype=cdt, device=w.device) if out is None else out
        for j in range(w.shape[0]):
            torch.mv(w[j], x[j].to(cdt), out=out[j])
        return out
    return torch.sum(w * x.to(cdt).unsqueeze(-2), -1, dtype=cdt, out=out)


@dataclass(frozen=True)
class RowDot:
    """Coefficients c_i = W_i · x_g (Thm 7's u = W (z_C − z)), x (G, n) one per group, in x's dtype; written
    straight into the coefficient vector, block by block."""

    x: Tensor

    def __call__(self, w: Tensor, groups: slice, _rows: slice, out: Tensor) -> Tensor:
        return row_dot(w, self.x[groups], self.x.dtype, out)


def _blocks(groups: int, rows: int, row_bytes: int, device: torch.device) -> list[tuple[slice, slice]]:
    """(groups, rows) slices of a (groups, rows, n) stack, each about the device's block budget: whole groups
    where one fits, else row blocks of one group."""
    budget = CPU_BLOCK_BYTES if device.type == "cpu" else GPU_BLOCK_BYTES
    group_bytes = max(rows * row_bytes, 1)
    if group_bytes <= budget:
        k = budget // group_bytes
        return [(slice(g, min(g + k, groups)), slice(0, rows)) for g in range(0, groups, k)]
    step = max(1, budget // max(row_bytes, 1))
    return [(slice(g, g + 1), slice(lo, min(lo + step, rows))) for g in range(groups) for lo in range(0, rows, step)]


def _in_compute_dtype(w: Tensor, cdt: torch.dtype) -> Tensor:
    """A block as the arithmetic reads it: converted on the CPU (once, while in cache; its kernels would
    convert it again for every operation), as it is on a GPU, whose kernels convert as they read."""
    return w if w.dtype == cdt or w.device.type != "cpu" else w.to(cdt)


def _as_stack(W: Tensor, coef: Coefficients, vec: Tensor) -> tuple[Tensor, Coefficients, Tensor, int]:
    """W, c, v as a stack of G groups (one v each): a stack as it is (v (G, n)), one matrix (or an MoE's experts
    as rows of (E·out, in)) as a stack of one."""
    groups = vec.shape[0] if vec.dim() == 2 else 1
    W3 = W if W.dim() == 3 and groups == W.shape[0] else W.reshape(groups, -1, W.shape[-1])
    if not callable(coef):
        coef = coef.reshape(groups, -1)
    return W3, coef, vec.reshape(groups, -1), groups


def add_rank1_by_rows(W: Tensor, coef: Coefficients, vec: Tensor, out: Tensor | RankOneAction | list,
                      cdt: torch.dtype) -> Tensor:
    """out = W + c vecᵀ over the rows of W's storage, computed in `cdt` and rounded once to out's dtype: W viewed
    as (rows, n) with vec (n,), or a stack W (G, rows, n) with one vec per group, vec (G, n) (every layer's copy
    of a matrix, `layer_stack.py`), out of W's shape. `coef` is c, or a function of a block of rows that returns
    their coefficients (`Coefficients`). Returns c: (rows,), or (G, rows) for a stack. With a `RankOneAction`
    for `out` (apply=action; a list of them for a stack), c and vec are kept instead and W + c vecᵀ is never
    formed."""
    stacked = vec.dim() == 2
    W3, coef3, vec3, groups = _as_stack(W, coef, vec)
    vec3 = vec3.to(cdt)
    if isinstance(out, (RankOneAction, list)):
        c = _coefficients(W3, coef3, vec3, cdt)
        for g, action in enumerate([out] if isinstance(out, RankOneAction) else out):
            action.keep(W3[g] if stacked else W, c[g], vec3[g], cdt)
        return c if stacked else c[0]
    O3 = out.view(W3.shape)
    c_all = torch.empty(W3.shape[:2], dtype=cdt, device=W.device)
    # last rows first: the first rows, which the forward reading `out` starts with, are then still in the
    # last-level cache (measured: 3 % of a patched Llama 3.2 1B pass on 2 cores)
    for g, rows in reversed(_blocks(groups, W3.shape[1], W3.shape[2] * vec3.element_size(), W.device)):
        w = _in_compute_dtype(W3[g, rows], cdt)
        _rank1_into(w, _block_coefficients(coef3, w, g, rows, c_all[g, rows], cdt), vec3[g], O3[g, rows])
    return c_all if stacked else c_all.reshape(-1)


def _rank1_into(w: Tensor, c: Tensor, vec: Tensor, out: Tensor) -> None:
    """out = w + c vecᵀ for a block w (k, r, n), c (k, r), vec (k, n), rounded once into out's dtype. On the CPU
    `torch.addr` group by group (in place on the block, then copied, where out has another dtype: the block is a
    converted copy then), 10–15 % faster there than `torch.addcmul`, and the bits of the per-layer update before
    stacks existed; elsewhere one `torch.addcmul`, whose kernels read bfloat16 and compute in float32. Elementwise
    either way: a row's bits do not depend on the block."""
    if _cpu_kernels(w, c.dtype):
        for j in range(w.shape[0]):
            if out.dtype == w.dtype:
                torch.addr(w[j], c[j], vec[j], out=out[j])
            else:
                out[j].copy_(w[j].addr_(c[j], vec[j]))
        return
    torch.addcmul(w, c.unsqueeze(-1), vec.unsqueeze(-2), out=out)


def _coefficients(W3: Tensor, coef: Coefficients, vec3: Tensor, cdt: torch.dtype) -> Tensor:
    """c (G, rows) of a stack, by the same blocks as the update (one pass over W where c reads its rows)."""
    if not callable(coef):
        return coef.to(cdt)
    c = torch.empty(W3.shape[:2], dtype=cdt, device=W3.device)
    for g, rows in _blocks(W3.shape[0], W3.shape[1], W3.shape[2] * vec3.element_size(), W3.device):
        _block_coefficients(coef, _in_compute_dtype(W3[g, rows], cdt), g, rows, c[g, rows], cdt)
    return c


def _block_coefficients(coef: Coefficients, w: Tensor, groups: slice, rows: slice, slot: Tensor,
                        cdt: torch.dtype) -> Tensor:
    """A block's coefficients, in their slot of the coefficient vector (written there by `coef` where it can)."""
    c = coef(w, groups, rows, slot) if callable(coef) else coef[groups, rows].to(cdt)
    if c is not slot:
        slot.copy_(c)
    return slot


def input_update_rounded(W: Tensor, layout: str, z_c: Tensor, z: Tensor, out, cdt: torch.dtype) -> Tensor:
    """Thms 6–7 on one input matrix in its storage layout: out = W + ΔW rounded, ΔW = W (z_C − z) zᵀ / ‖z‖²
    for the effective matrix. Returns u = W (z_C − z) (flattened over experts for EXPERTS). A LINEAR stack of
    every layer's copy (W (L, out, in), z_c and z (L, in), out (L, out, in) or a list of L actions) is
    updated in one call, each layer with its own z: the same bits as one layer at a time."""
    z_c, z = z_c.to(cdt), z.to(cdt)
    s = lemmas.input_direction(z)
    if layout == CONV1D:  # W (in, out) holds the effective matrix's transpose: ΔW = s uᵀ on the storage
        u, _ = lemmas.input_update(W.to(cdt).T, z_c, z)
        add_outer_rounded(W, u, s, out, CONV1D, cdt)
        return u
    if layout == EXPERTS_IN_OUT:  # (E, in, out): each expert's storage is its effective matrix's transpose
        us = []
        for e in range(W.shape[0]):
            u, _ = lemmas.input_update(W[e].to(cdt).T, z_c, z)
            add_rank1_by_rows(W[e], s, u, out[e], cdt)
            us.append(u)
        return torch.cat(us)
    # linear (out, in), a stack of them (L, out, in), or experts (E, out, in) as (E·out, in): u_i = W_i · (z_C − z)
    return add_rank1_by_rows(W, RowDot((z_c - z).reshape(-1, z.shape[-1])), s, out, cdt)  # a row per layer


def add_outer_rounded(W: Tensor, u: Tensor, s: Tensor, out: Tensor, layout: str = "linear",
                      cdt: torch.dtype | None = None) -> None:
    """out = W + ΔW rounded once to out's dtype, ΔW = u sᵀ for the effective matrix: W (out, in) linear,
    its transpose for Conv1D, u_e sᵀ per expert (u (E, out)) for EXPERTS."""
    cdt = cdt or u.dtype
    if layout == CONV1D:
        add_rank1_by_rows(W, s, u, out, cdt)
    else:  # EXPERTS: rows of (E·out, in), coefficients u flattened
        add_rank1_by_rows(W, u.reshape(-1) if layout == EXPERTS else u, s, out, cdt)


@dataclass
class RankOneAction:
    """A matrix's rank-1 update kept as its factors (apply=action): W + c vᵀ over the rows of W's storage,
    never formed. The module's own forward computes W·z from the unchanged W; `correction` adds c (vᵀz),
    or (z·c) vᵀ for a Conv1D (GPT-2: storage (in, out), y = z W), both in the model's dtype, so nothing
    the patch computes in float32 reaches the pass unrounded. Only the coefficients are computed (one
    pass over W where they read its rows), not W + ΔW: no matrix is written."""

    W: Tensor | None = None
    coef: Tensor | None = None  # c (rows of the storage,) in the model's dtype
    vec: Tensor | None = None  # v (columns of the storage,) in the model's dtype

    def keep(self, W: Tensor, c: Tensor, vec: Tensor, cdt: torch.dtype) -> None:
        """Keep W and the factors c (rows,), vec (n,) (given in `cdt`), rounded to W's dtype."""
        if W.dim() != 2:
            raise ValueError("apply=action keeps rank-1 updates of 2-D matrices; stacked experts (MoE) are refused")
        self.W, self.coef, self.vec = W, c.to(W.dtype), vec.to(W.dtype)

    def correction(self, z: Tensor, conv1d: bool = False) -> Tensor:
        """What the update adds to its module's output for the input z, in the model's dtype."""
        if conv1d:  # GPT-2's Conv1D, y = z W_storage: (W + c vᵀ) adds (z·c) vᵀ
            return (z @ self.coef).unsqueeze(-1) * self.vec
        return (z @ self.vec).unsqueeze(-1) * self.coef  # nn.Linear, y = z W_storageᵀ: adds (z·v) c

    def linear(self, z: Tensor, bias: Tensor | None) -> Tensor:
        """The patched nn.Linear's output for z: its own product with W, plus the correction."""
        return torch.nn.functional.linear(z, self.W, bias) + self.correction(z)


def patched_linear(z: Tensor, weight: Tensor | RankOneAction, bias: Tensor | None) -> Tensor:
    """An nn.Linear's output with a patched weight: W + ΔW rounded, or a kept action."""
    if isinstance(weight, RankOneAction):
        return weight.linear(z, bias)
    return torch.nn.functional.linear(z, weight, bias)


@dataclass
class PatchBuffers:
    """One layer's patched tensors (`tensors`, by parameter name relative to the layer) in the model's
    dtype; their storage is reused layer after layer and token after token. With apply=action a matrix's
    slot is a `RankOneAction` instead (`actions`): vectors (norm scales, biases) are always written."""

    dtype: torch.dtype
    apply: str = MATERIALIZED
    tensors: dict[str, Tensor] = field(default_factory=dict)
    actions: dict[str, RankOneAction] = field(default_factory=dict)
    _store: dict[str, Tensor] = field(default_factory=dict)

    def begin(self) -> None:
        self.tensors = {}
        self.actions = {}

    def out(self, name: str, like: Tensor) -> Tensor | RankOneAction:
        if self.apply == ACTION and like.dim() >= 2:
            action = self.actions[name] = RankOneAction()
            return action
        t = self._store.get(name)
        if t is None or t.shape != like.shape or t.device != like.device:
            t = self._store[name] = torch.empty(like.shape, dtype=self.dtype, device=like.device)
        self.tensors[name] = t
        return t
