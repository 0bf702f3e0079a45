"""What Goldwaser et al.'s experiments' config classes share: the patch variants and apply modes as Enums (from
the patching registry's own lists), layer_errors' dtypes and the Fig. 3 prompt. Each experiment's config class
and presets are in its home (experiments/goldwaser/<name>/__init__.py); a type used by one experiment alone
lives there with it. Torch-free: imported before every composition."""

from __future__ import annotations

from enum import StrEnum

from experiments.patching.kinds import APPLY_MODES
from experiments.patching.variants import VARIANTS

# experiments/patching/variants.py's VARIANTS, in its order: the registry is the one list of names (torch-free)
PatchVariant = StrEnum("PatchVariant", {name: name for name in VARIANTS})
PatchApply = StrEnum("PatchApply", {name: name for name in APPLY_MODES})


# layer_errors' `dtypes=`: float64 end to end beside float32 (no half precision: its claims are about rounding
# well below the bars the 16-bit formats set)
LayerDtype = StrEnum("LayerDtype", {name: name for name in ("float32", "float64")})


# Fig. 3's prompt (patch_match's, patch_export's, and one of layer_errors')
MARS_PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."
