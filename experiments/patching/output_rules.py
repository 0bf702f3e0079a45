"""The open loop's output step (Algorithm 1): make the outer function's output move by r = v_C − v,
reading y, d, the routing from the with-context pass, through the adapter's Table 1 rule
(`patching/rules/`, one class per rule). The closed loop (`closed_loop.py`) calls the same rules'
in-pass step instead.

The names below stay importable from here for callers of the open loop (patcher, gemma3, fixed_patch).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching.arch.base import BlockAdapter
from experiments.patching.rounded import PatchBuffers
from experiments.patching.rules import LayerPatchStats
from experiments.patching.rules.moe import moe_down_rounded
from experiments.patching.rules.scale import scale_input

__all__ = ["LayerPatchStats", "apply_output_rule", "moe_down_rounded", "owner", "scale_input"]


def owner(adapter: BlockAdapter, layer: nn.Module) -> nn.Module:
    """The module whose parameter the output rule changes (`BlockAdapter.owner`)."""
    return adapter.owner(layer)


def apply_output_rule(adapter: BlockAdapter, layer: nn.Module, r: Tensor, values: dict, bufs: PatchBuffers,
                      cdt: torch.dtype) -> LayerPatchStats:
    """Open loop (Algorithm 1): the outer function's output moves by r, with y, d and the routing read
    from the with-context pass (`values`); the changed parameter is written rounded into `bufs`."""
    stats = LayerPatchStats()
    P = layer.get_parameter(adapter.output_param)
    adapter.rule.open_loop(adapter, layer, r, values, P, bufs.out(adapter.output_param, P), cdt, stats)
    return stats
