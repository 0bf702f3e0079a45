"""The open loop's output step (Algorithm 1): make the outer function's output move by r = v_C − v,
reading y, d, the routing from the with-context pass, through the adapter's Table 1 rule
(`patching/rules/`, one class per rule). The closed loop (`closed_loop.py`) calls the same rules'
in-pass step instead.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching.arch.base import BlockAdapter
from experiments.patching.rounded import PatchBuffers
from experiments.patching.rules import LayerPatchStats

__all__ = ["LayerPatchStats", "apply_output_rule"]


def apply_output_rule(adapter: BlockAdapter, layer: nn.Module, r: Tensor, values: dict, bufs: PatchBuffers,
                      cdt: torch.dtype) -> LayerPatchStats:
    """Open loop (Algorithm 1): the outer function's output moves by r, with y, d and the routing read
    from the with-context pass (`values`); the changed parameter is written rounded into `bufs`."""
    stats = LayerPatchStats()
    P = layer.get_parameter(adapter.output_param)
    adapter.rule.open_loop(adapter, layer, r, values, P, bufs.out(adapter.output_param, P), cdt, stats)
    return stats
