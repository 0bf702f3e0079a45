"""How two next-token distributions are compared: the one home of the logit metrics every Goldwaser
experiment logs (patch_match, layer_errors, context_compile, patch_export, system prompts).

Logits are compared in float32, or in float64 for a float64 model: float64 end to end, so a difference of
1e-12 is logged as 1e-12, not as 0, and two logits 4e-16 apart do not straddle a float32 midpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logit_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a model's logits are compared in: float64 for a float64 model, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def comparable(logits: Tensor) -> Tensor:
    """A model's logits in the dtype they are compared in (bfloat16 and float32 as float32)."""
    return logits.to(logit_dtype(logits.dtype))


def logit_comparison(reference: Tensor, other: Tensor) -> dict[str, float]:
    """L∞ of the logit difference (absolute, and relative to max |reference|), the total variation
    distance ½‖p − q‖₁ of the two softmax distributions, and whether the top-1 tokens agree (float64)."""
    a, b = reference.double(), other.double()
    linf = float((a - b).abs().max())
    return {
        "logit_linf": linf,
        "logit_linf_rel": linf / max(float(a.abs().max()), 1e-300),
        "tvd": 0.5 * float((a.softmax(-1) - b.softmax(-1)).abs().sum()),
        "top1_match": float(int(a.argmax()) == int(b.argmax())),
    }
