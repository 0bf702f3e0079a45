"""What a Table 1 output rule is to the engine: one object with two steps that make the outer function's
output move by a residual r, writing the changed parameter rounded into the layer's patch buffers.

- `open_loop` (naive, Algorithm 1): r = v_C − v is given; the rule reads what it needs (y, d, the
  routing) from the with-context pass's captured `values`.
- `closed_loop` (closed_loop.py): runs in the pre-hook of the module that owns the parameter, inside the
  patched pass; it sees that module's real input and solves for the r that makes the layer output the
  with-context T(C, x) (`target_minus_v` = T(C, x) − v′).
- `fit_positions` (the fixed patch, fixed_patch.py): one change fitted at k positions at once, the
  least-squares version of the rule (lemmas_ls.py); `exact_at_k` says whether it can be exact for k > 1.
Why classes: the engine calls `adapter.rule.open_loop(...)` and never branches on a rule's name, so a
new row of Table 1 is one file here plus one line in the registry (rules/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from experiments.patching.block import Block
from experiments.patching.capture import first_output, last_position


@dataclass
class LayerPatchStats:
    """A layer's patch statistics. Inside a patched pass they are device tensors (0-d), so that no layer
    reads anything back to the host; `PatchedPass.finish` turns them into numbers, in one read a pass."""

    div_zero: int | Tensor = 0  # coordinates where a division (Thm 10, App. B) was undefined
    no_root: int | Tensor = 0  # 1 when App. B's multiplier equation had no root on (−∞, min m²)
    dm_linf: float | Tensor = 0.0  # max |Δ| of the output parameter (Δm, Δb, or ΔW′'s factor r)
    routing_changed: int | Tensor = 0  # MoE: 1 when the patched pass picked other experts than the context pass


def module_input(args: tuple, kwargs: dict) -> Tensor:
    """The first input of a module's forward, however the caller passed it."""
    return args[0] if args else kwargs["hidden_states"]


def as_rows(t: Tensor) -> Tensor:
    """A module's input or output as float64 rows, one per position (the fixed patch's algebra)."""
    return t.detach().reshape(-1, t.shape[-1]).double()


class OutputRule:
    """One row of Table 1's output side, the object an adapter holds as its `output_rule`. Subclasses set
    `key` (its name in tables and metrics), `theorem` and what the variants and the fit need to know of it,
    and write the steps; `stats` is filled in place (dm_linf, div_zero). Rules hold no state: two are equal
    when they are the same rule."""

    key: ClassVar[str]
    theorem: ClassVar[str]
    exact_at_k: ClassVar[bool] = False  # fit_positions can match k > 1 positions exactly (a matrix, not a vector)
    # its parameter is the scale of a norm after the MLP (Thm 10): it divides by the MLP's normalized outputs,
    # and App. B's variants and the closed loop's conditioning (a W_down step before the norm) apply to it
    post_norm: ClassVar[bool] = False
    routed_experts: ClassVar[bool] = False  # it moves each active expert's outer side (Thm 11): 3-D stacks
    takes_ridge: ClassVar[bool] = False  # its least squares solves for a matrix, which a ridge regularizes

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), self.key))

    def __repr__(self) -> str:
        return self.key

    __str__ = __repr__

    def open_loop(self, adapter: Block, layer: nn.Module, r: Tensor, values: dict, P: Tensor, out: Tensor,
                  cdt: torch.dtype, stats: LayerPatchStats) -> None:
        """Write into `out` the parameter P moved so that the outer output moves by r (read: `values`)."""
        raise NotImplementedError

    def closed_loop(self, adapter: Block, module: nn.Module, P: Tensor, out: Tensor, args: tuple,
                    kwargs: dict, target_minus_v: Tensor, cdt: torch.dtype, stats: LayerPatchStats) -> None:
        """Write into `out` (the tensor `module` reads in place of P) the parameter that makes the layer
        output v′ + g = T(C, x), from `module`'s input in this pass (`args`, `kwargs`)."""
        raise NotImplementedError

    def fit_positions(self, adapter: Block, module: nn.Module, P: Tensor, args: tuple, kwargs: dict,
                      R: Tensor) -> tuple[Tensor, Tensor]:
        """The fixed patch's output side: (Δ for P, float64; what Δ moves the module's output by at each
        row), least squares against R (k, d), the residual each of the k positions needs, from `module`'s
        input at those positions (`args`, `kwargs`: the module's forward, already input-patched)."""
        raise NotImplementedError

    @staticmethod
    def residual_in_pass(module: nn.Module, P: Tensor, out: Tensor, args: tuple, kwargs: dict,
                         target_minus_v: Tensor, cdt: torch.dtype) -> Tensor:
        """r = T(C, x) − T′: what the module's output must still move by, T′ = v′ + g the layer's output
        with the original parameter. `out` holds P afterwards (the module reads it in the call)."""
        out.copy_(P)
        g = last_position(first_output(module.forward(*args, **kwargs))).to(cdt)  # .forward: no hooks
        return target_minus_v - g
