"""Patched tensors W + ΔW, computed in the compute dtype and rounded once to the model's dtype, in buffers
reused layer after layer and token after token.

Every rank-1 update here is ΔW = c vᵀ over the rows of W's storage, where row i's coefficient c_i may
depend on that row itself (the input update's c_i = W_i · (z_C − z); the closed loop's outer-weight
solve, c_i = t_i − W_i · y). On the CPU `add_rank1_by_rows` walks W in row blocks of about 2 MiB: a
block is read from memory once, used for its coefficients and for W + c vᵀ while it is still in cache,
and written rounded into the output buffer; a bfloat16 W never needs a float32 copy of the whole matrix.
A block's coefficients are MKL's matrix-vector product (`torch.mv`): on an idle 2-core AMD EPYC (AVX2) it
took a Gemma 3 270M MLP matrix's update (2048 × 640, float32) from 0.71 ms (an elementwise product into a
scratch block and a row sum, used before) to 0.30–0.54 ms, and a 1B shape's (8192 × 2048) was no slower
(11.6 against 11.2–11.9 ms; the write alone 8.5 ms).
On a GPU a block is the whole matrix: two kernels, no launch per block.
(Spreading blocks over Python threads measured slower inside a model's forward, so there is none.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from experiments.patching import lemmas
from experiments.patching.kinds import ACTION, CONV1D, EXPERTS, EXPERTS_IN_OUT, MATERIALIZED

CPU_BLOCK_BYTES = 1 << 21  # a row block in the compute dtype: stays in cache between its two uses
GPU_BLOCK_BYTES = 1 << 28  # one block for a 1B model's matrices; bounds the float32 copy of a bf16 one

Coefficients = Tensor | Callable[[Tensor, slice], Tensor]  # (rows,) or (block of W in cdt, its rows) -> (block,)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Patch arithmetic is float32, float64 for float64 models."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_blocks(rows: int, row_bytes: int, device: torch.device) -> list[slice]:
    budget = CPU_BLOCK_BYTES if device.type == "cpu" else GPU_BLOCK_BYTES
    step = max(1, budget // max(row_bytes, 1))
    return [slice(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def add_rank1_by_rows(W: Tensor, coef: Coefficients, vec: Tensor, out: Tensor | RankOneAction,
                      cdt: torch.dtype) -> Tensor:
    """out = W + c vecᵀ over the rows of W's storage (W viewed as (rows, n)), computed in `cdt` and rounded
    once to out's dtype. `coef` is the coefficient vector c, or a function of a block of W's rows (in cdt)
    and their slice that returns their coefficients. Returns c (rows,) in cdt. With a `RankOneAction` for
    `out` (apply=action), c and vec are kept instead and W + c vecᵀ is never formed."""
    if isinstance(out, RankOneAction):
        return out.keep(W, coef, vec, cdt)
    W2 = W.reshape(-1, W.shape[-1])
    O2 = out.view(-1, out.shape[-1])
    vec = vec.to(cdt)
    c_all = torch.empty(W2.shape[0], dtype=cdt, device=W.device)
    # last rows first: the first rows, which the forward reading `out` starts with, are then still in the
    # last-level cache (measured: 3 % of a patched Llama 3.2 1B pass on 2 cores)
    for rows in reversed(_row_blocks(W2.shape[0], W2.shape[1] * vec.element_size(), W.device)):
        w = W2[rows]
        w = w if w.dtype == cdt else w.to(cdt)
        c = coef(w, rows) if callable(coef) else coef[rows].to(cdt)
        c_all[rows] = c
        if O2.dtype == cdt:
            torch.addr(w, c, vec, out=O2[rows])
        else:  # w is a converted copy here: update it in place, round once
            O2[rows].copy_(w.addr_(c, vec))
    return c_all


def input_update_rounded(W: Tensor, layout: str, z_c: Tensor, z: Tensor, out: Tensor, cdt: torch.dtype) -> Tensor:
    """Thms 6–7 on one input matrix in its storage layout: out = W + ΔW rounded, ΔW = W (z_C − z) zᵀ / ‖z‖²
    for the effective matrix. Returns u = W (z_C − z) (flattened over experts for EXPERTS)."""
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
    # linear (out, in), or experts (E, out, in) as (E·out, in): u_i = W_i · (z_C − z), row by row (Thm 7's u)
    dz = z_c - z
    return add_rank1_by_rows(W, lambda w, _rows: torch.mv(w, dz), s, out, cdt)


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
    matrix-vector product), not W + ΔW: no matrix is written."""

    W: Tensor | None = None
    coef: Tensor | None = None  # c (rows of the storage,) in the model's dtype
    vec: Tensor | None = None  # v (columns of the storage,) in the model's dtype

    def keep(self, W: Tensor, coef: Coefficients, vec: Tensor, cdt: torch.dtype) -> Tensor:
        if W.dim() != 2:
            raise ValueError("apply=action keeps rank-1 updates of 2-D matrices; stacked experts (MoE) are refused")
        vec = vec.to(cdt)
        if callable(coef):  # its coefficients read W's rows (Thm 7's c_i = W_i · (z_C − z)): one pass over W
            c = torch.empty(W.shape[0], dtype=cdt, device=W.device)
            for rows in _row_blocks(W.shape[0], W.shape[1] * vec.element_size(), W.device):
                c[rows] = coef(W[rows].to(cdt), rows)
        else:
            c = coef.to(cdt)
        self.W, self.coef, self.vec = W, c.to(W.dtype), vec.to(W.dtype)
        return c

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
