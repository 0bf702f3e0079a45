"""gpt_wq's typed schema names the variants gpt/variants.py defines, and rejects the others while
composing."""

from __future__ import annotations

from experiments.karbevski.gpt.variants import VARIANTS
from experiments.karbevski.schema import GptVariant


def test_schema_variants_are_table_2s():
    assert [v.value for v in GptVariant] == [*VARIANTS, "all"]


def test_a_variant_that_does_not_exist_fails_while_composing():
    import pytest

    from cli.overrides import validate
    from experiments.core.errors import UserError

    with pytest.raises(UserError, match="variant='baseline' is not one of baseline_small_mlp, .*, all"):
        validate("gpt_wq", ["preset=smoke", "variant=baseline"], multirun=False)
