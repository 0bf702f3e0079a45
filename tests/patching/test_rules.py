"""The registries behind "an architecture is one adapter file, a rule is one rule file": every adapter
names a rule the registry has and carries a tiny model of its own model_type; every rule has both steps."""

from __future__ import annotations

from experiments.patching.arch import ADAPTERS, FAMILIES, TINY_MODELS
from experiments.patching.kinds import MOE_BIAS
from experiments.patching.rules import RULES, OutputRule, rule_for


def test_every_adapter_names_a_registered_rule_and_gets_its_class():
    for adapter in FAMILIES:
        assert adapter.output_rule in RULES, adapter.family
        assert adapter.rule is RULES[adapter.output_rule]
    # no rule without a family using it: by an adapter file, or gpt-oss's experts' biases, found from its module
    # tree (tests/patching/test_structure.py patches it)
    assert {a.output_rule for a in ADAPTERS.values()} | {MOE_BIAS} == set(RULES)


def test_every_rule_overrides_both_steps_and_says_its_theorem():
    for key, rule in RULES.items():
        assert rule.key == key and rule.theorem.startswith("Thm ")
        assert type(rule).open_loop is not OutputRule.open_loop, key
        assert type(rule).closed_loop is not OutputRule.closed_loop, key


def test_unknown_rule_is_named():
    import pytest

    with pytest.raises(ValueError, match="unknown output rule 'weird'; known: outer_bias"):
        rule_for("weird")


def test_every_family_carries_a_tiny_config_of_its_own_model_type():
    assert [a.family for a in TINY_MODELS.values()] == [a.family for a in FAMILIES]
    for name, adapter in TINY_MODELS.items():
        config = adapter.tiny_config(300)
        assert config.model_type in adapter.model_types, name
        assert config.vocab_size == 300 and not config.tie_word_embeddings, name
