"""How two next-token distributions are compared: the one home of the logit metrics every Goldwaser
experiment logs (patch_match, layer_errors, context_compile, patch_export, system prompts).

Logits are compared in float32, or in float64 for a float64 model: float64 end to end, so a difference of
1e-12 is logged as 1e-12, not as 0, and two logits 4e-16 apart do not straddle a float32 midpoint.

`ROUNDING` is the one table of what "the same up to rounding" means, per dtype: the bar of every rounding,
logit and reload claim (patch_match, patch_export, layer_errors, context_compile, system_compile's reload),
so a float64 run is judged by float64's bar and a float32 step slipped into it fails.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# max |Δ| / max |reference| that counts as rounding. float64: 1e-10 is ~10^6 unit roundoffs (1.1e-16), room for
# depth and a block that amplifies (Thm 10's division: a random tiny Gemma 4 reaches 4.6e-11, a tiny Gemma 3
# 1.2e-12; the trained Qwen2.5 7e-15) while one float32 step anywhere (its roundoff 6e-8: 2.6e-8 to 5.2e-8 after
# the layers that follow it on tiny-llama) fails by 100x or more; float32 and bfloat16 at their rounding level
# through a deep model
ROUNDING = {"float64": 1e-10, "float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-3}
# one layer's output against the with-context pass's (the open loop's per-layer evidence, and a closed loop's, each
# layer solved for it); bfloat16 wider than its logit bar: a hidden state's largest entries round coarser
LAYER_EXACT = {"float64": 1e-10, "float32": 1e-4, "bfloat16": 5e-2}
# a closed loop's last-layer control at least this many decades further from the record (bfloat16's own rounding,
# 4e-3 a step, leaves two decades below an O(1) control)
RECORD_DECADES = {"float64": 3.0, "float32": 3.0, "bfloat16": 1.0}
# cached against uncached with-context logits: attention over a cache or over the whole sequence rounds
# differently (bfloat16 logits several of its steps apart over a long reply); a wrong cache or prompt is O(1)
CACHED_ROUNDING = {**ROUNDING, "bfloat16": 5e-2}


def rounding_bar(dtype: torch.dtype | str) -> float:
    """The relative bar of `dtype` (a torch dtype or its name, "float32"); one line naming the known ones."""
    name = str(dtype).removeprefix("torch.")
    if name not in ROUNDING:
        raise ValueError(f"no rounding bar for dtype {name!r}: one of {', '.join(ROUNDING)}")
    return ROUNDING[name]


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
    linf = float((a - b).abs().max())  # NaN anywhere: NaN (torch's max propagates it), and so is every entry
    nan = math.isnan(linf)
    return {
        "logit_linf": linf,
        "logit_linf_rel": linf / max(float(a.abs().max()), 1e-300),
        "tvd": 0.5 * float((a.softmax(-1) - b.softmax(-1)).abs().sum()),
        "top1_match": math.nan if nan else float(int(a.argmax()) == int(b.argmax())),  # argmax would pick a NaN
    }


def relative_error(reference: Tensor, other: Tensor) -> float:
    """max |other − reference| / max |reference| in float64; NaN anywhere: NaN."""
    ref = reference.double()
    return float((other.double() - ref).abs().max()) / max(float(ref.abs().max()), 1e-300)


def top2_margin(logits: Tensor) -> float:
    """The largest logit minus the second largest (float64): how near a tie the top-1 token is. A patched
    model can pick another token only where this margin is at most twice its logit L∞ error."""
    top = logits.double().topk(2).values
    return float(top[0] - top[1])
