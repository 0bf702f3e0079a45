"""The five configurations of Karbevski & Mijoski Table 2, as a table in code (`variant=<name>`).

A variant is stated relative to a base shape (n_layer, n_head, d_model, ...) so the same comparison runs
at the paper's GPT-2 small shape and at the smaller shapes of the gpu / cpu / smoke presets. The one
knob that needs a rule to scale is the "smaller d_model" baseline: the paper takes d_model = 744, the
smallest multiple of the head count whose model is at least as large as the W_Q = I model (117.92M vs
117.30M); `param_matched_width` applies that rule at any shape (744 at the paper's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from experiments.karbevski.gpt.model import GPTConfig
from experiments.karbevski.gpt.params import count_formula

WEIGHT_DECAY_BASELINE = 0.1
WEIGHT_DECAY_IDENTITY = 2.0**-5  # "over 3x lower" (§5.1, practical adjustment 2)


@dataclass(frozen=True)
class Variant:
    name: str
    label: str  # Table 2's column header
    query: str  # learned | identity
    mlp_mult: float
    width: str  # "base" or "param_matched" (the smaller-d_model baseline)
    attn_scale_mult: float
    weight_decay: float
    # Table 2 at the paper's shape, for the figure, the CSV and the claims
    paper_total_m: float
    paper_non_embedding_m: float
    paper_val_loss: float


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("baseline_small_mlp", "Baseline (smaller MLP)", "learned", 3.5, "base", 1.0,
            WEIGHT_DECAY_BASELINE, 117.30, 77.88, 3.026),
    Variant("baseline_small_d", "Baseline (smaller d_model)", "learned", 4.0, "param_matched", 1.0,
            WEIGHT_DECAY_BASELINE, 117.92, 79.73, 3.027),
    Variant("wq_identity_117m", "W_Q = I (117M)", "identity", 4.0, "base", 0.5,
            WEIGHT_DECAY_IDENTITY, 117.30, 77.88, 3.018),
    Variant("baseline_124m", "Baseline (124M)", "learned", 4.0, "base", 1.0,
            WEIGHT_DECAY_BASELINE, 124.37, 84.95, 3.016),
    Variant("wq_identity_large_mlp", "W_Q = I (larger MLP)", "identity", 4.5, "base", 0.5,
            WEIGHT_DECAY_IDENTITY, 124.37, 84.95, 3.004),
)}


def mlp_width(d_model: int, mult: float) -> int:
    return int(round(mult * d_model))


def param_matched_width(base: GPTConfig) -> int:
    """Smallest multiple of n_head whose learned-query, 4x-MLP model has at least as many parameters as
    the W_Q = I model at the base width."""
    target = count_formula(replace(base, query="identity"))["total"]
    d = base.n_head
    while d < base.d_model:
        cfg = replace(base, d_model=d, mlp_hidden=mlp_width(d, 4.0), query="learned")
        if count_formula(cfg)["total"] >= target:
            return d
        d += base.n_head
    return base.d_model


def model_config(variant: Variant, base: GPTConfig) -> GPTConfig:
    """The GPTConfig of `variant` at the base shape (base.query, mlp_hidden and scale are ignored)."""
    d = param_matched_width(base) if variant.width == "param_matched" else base.d_model
    return replace(base, d_model=d, mlp_hidden=mlp_width(d, variant.mlp_mult), query=variant.query,
                   attn_scale_mult=variant.attn_scale_mult)
