"""patch_match's typed schema names the variants the patching code knows, in its order (the error
for a bad variant lists them)."""

from __future__ import annotations

from experiments.goldwaser.schema import PatchVariant
from experiments.patching.arch import VARIANTS


def test_schema_variants_are_the_patchers():
    assert tuple(v.value for v in PatchVariant) == VARIANTS
