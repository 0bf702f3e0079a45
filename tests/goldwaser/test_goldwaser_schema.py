"""Goldwaser's typed schemas: patch_match names the variants the patching code knows, in its order (the
error for a bad variant lists them), and the keys of patch_export, layer_errors and context_compile are
typed, so a bad value is one line from composition, before the experiment or torch is imported."""

from __future__ import annotations

import pytest

from cli.overrides import validate
from experiments.core.errors import UserError


@pytest.mark.parametrize("name, override, said", [
    ("context_compile", "k=many", "k='many' is ill-typed: expected an integer"),
    ("context_compile", "sweep=[1,x]", "sweep[1]='x' is ill-typed: expected an integer"),
    ("context_compile", "per_token=maybe", "per_token='maybe' is ill-typed: expected true or false"),
    ("layer_errors", "max_new_tokens=x", "max_new_tokens='x' is ill-typed: expected an integer"),
    ("layer_errors", "delta_rel.float32=big", "delta_rel.float32='big' is ill-typed: expected a number"),
    ("patch_export", "variant=fast", "variant='fast' is not one of naive, stable, conditioned, closed_loop"),
    ("patch_export", "chat_template=sometimes", "chat_template='sometimes' is ill-typed: expected true or false"),
])
def test_ill_typed_value_is_refused_while_composing(name, override, said):
    with pytest.raises(UserError) as err:
        validate(name, [override, "preset=smoke"], multirun=False)
    assert str(err.value).startswith(said)


def test_stop_at_eos_keeps_its_three_words():
    """A string node: `stop_at_eos=true` reads back as "True", which context_compile's validate takes;
    a fourth word is its error, not the schema's."""
    with pytest.raises(UserError, match="stop_at_eos=maybe must be auto, true or false"):
        validate("context_compile", ["stop_at_eos=maybe", "preset=smoke"], multirun=False)
