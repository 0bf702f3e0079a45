"""Table 1's output rules, one class per row; an adapter holds one of the objects below as its `output_rule`.

Adding a rule: a file here with its `OutputRule` subclass (its steps, and what the variants and the fit
need to know of it: `post_norm`, `routed_experts`, `takes_ridge`), its object below and its line in RULES."""

from __future__ import annotations

from experiments.patching.rules.base import LayerPatchStats, OutputRule
from experiments.patching.rules.moe import MixtureOfExperts
from experiments.patching.rules.moe_bias import MixtureOfExpertBiases
from experiments.patching.rules.outer_bias import OuterBias
from experiments.patching.rules.outer_weight import OuterWeight
from experiments.patching.rules.scale import Scale

OUTER_BIAS = OuterBias()  # Thm 8
OUTER_WEIGHT = OuterWeight()  # Thm 9
SCALE = Scale()  # Thm 10
MOE = MixtureOfExperts()  # Thm 11
MOE_BIAS = MixtureOfExpertBiases()  # Thm 11 with Thm 8 (gpt-oss: experts with biases, found from its module tree)
RULES: dict[str, OutputRule] = {rule.key: rule for rule in (OUTER_BIAS, OUTER_WEIGHT, SCALE, MOE, MOE_BIAS)}


def rule_for(key: str) -> OutputRule:
    try:
        return RULES[key]
    except KeyError:
        raise ValueError(f"unknown output rule {key!r}; known: {', '.join(RULES)}") from None


__all__ = ["MOE", "MOE_BIAS", "OUTER_BIAS", "OUTER_WEIGHT", "RULES", "SCALE", "LayerPatchStats", "OutputRule",
           "rule_for"]
