"""Table 1's output rules, one class per row, keyed by the name an adapter gives in `output_rule`.

Adding a rule: a file here with its `OutputRule` subclass (open-loop and closed-loop step), and its
line in RULES below."""

from __future__ import annotations

from experiments.patching.rules.base import LayerPatchStats, OutputRule
from experiments.patching.rules.moe import MixtureOfExperts
from experiments.patching.rules.moe_bias import MixtureOfExpertBiases
from experiments.patching.rules.outer_bias import OuterBias
from experiments.patching.rules.outer_weight import OuterWeight
from experiments.patching.rules.scale import Scale

RULES: dict[str, OutputRule] = {rule.key: rule for rule in (
    OuterBias(),  # Thm 8
    OuterWeight(),  # Thm 9
    Scale(),  # Thm 10
    MixtureOfExperts(),  # Thm 11
    MixtureOfExpertBiases(),  # Thm 11 with Thm 8 (gpt-oss: experts with biases, found from its module tree)
)}


def rule_for(key: str) -> OutputRule:
    try:
        return RULES[key]
    except KeyError:
        raise ValueError(f"unknown output rule {key!r}; known: {', '.join(RULES)}") from None


__all__ = ["RULES", "LayerPatchStats", "OutputRule", "rule_for"]
