"""The numbers Goldwaser et al. report that the claims are held to and the figures draw as the paper's line, in
one module: a claim and a figure that quote the same number import it from here, not from each other.

Keyed by the variant the paper measured (patching/variants.py's names): a table of the paper's results, the
one place in goldwaser/ beside the registry where a variant's name is written (tests/goldwaser/test_no_names.py).
"""

from __future__ import annotations

from experiments.patching.variants import VARIANTS

# % top-1 token agreement in bfloat16, Gemma 3 1B on TPU (§4.2): Algorithm 1 and App. B
PAPER_BF16_MATCH = {"naive": 87.5, "stable": 98.0}
# the paper's best: the bar for a variant it did not measure (conditioned, a closed loop)
BEST_BF16_MATCH = max(PAPER_BF16_MATCH.values())


def algorithm1_bf16_match() -> tuple[str, float]:
    """(name, % agreement) of the variant that is the paper's Algorithm 1 (`paper_algorithm`)."""
    name = next(n for n in PAPER_BF16_MATCH if VARIANTS[n].paper_algorithm)
    return name, PAPER_BF16_MATCH[name]
