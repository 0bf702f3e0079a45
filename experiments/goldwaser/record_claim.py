"""The with-context side's claim, shared by every Goldwaser experiment that generates with a KV cache
(patch_match, layer_errors, patch_export, context_compile): the cached logits the targets and records come from
against an uncached forward of the whole sequence (the witness's reference, patching/witness.py)."""

from __future__ import annotations

import pandas as pd

from experiments.core.reduce import judged
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.patching.compare import CACHED_ROUNDING

SOURCE = "Goldwaser §4.2"


def cached_claim(ctx: RunContext, m: pd.DataFrame, dtype, model: str, prefix: str = "goldwaser") -> None:
    """The with-context side against itself: at every step, the KV-cached logits (the pass the targets and the
    record are taken in) against the witness's uncached forward of the whole sequence. A bug upstream of the
    targets (the cache, the positions, the prompt) shows here. `prefix`: the experiment's claim namespace."""
    name = dtype_name(dtype)
    value, note = judged(m, "cached_vs_uncached_logit_linf_rel")
    ctx.check(f"{prefix}.record.{name}_cached_equals_uncached", SOURCE + " (the with-context side)",
              f"the KV-cached with-context logits equal the witness's uncached forward of the prompt and reply so "
              f"far, every step: max |Δlogit| / max |logit| ({model}, {name}){note}", value, "<=",
              CACHED_ROUNDING[name], exact=True)
