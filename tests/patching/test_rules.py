"""The registries behind "an architecture is one adapter file, a rule is one rule file": every adapter
names a rule the registry has and carries a tiny model of its own model_type; every rule has both steps."""

from __future__ import annotations

from experiments.patching.arch import ADAPTERS, FAMILIES, TINY_MODELS
from experiments.patching.rules import MOE_BIAS, RULES, OutputRule, rule_for


def test_every_adapter_holds_a_registered_rule_object():
    for adapter in FAMILIES:
        assert adapter.output_rule is RULES[adapter.output_rule.key], adapter.family
        assert adapter.rule is adapter.output_rule  # no branch scale in an adapter file
    # no rule without a family using it: by an adapter file, or gpt-oss's experts' biases, found from its module
    # tree (tests/patching/test_structure.py patches it)
    assert {a.output_rule for a in ADAPTERS.values()} | {MOE_BIAS} == set(RULES.values())


def test_no_rule_is_told_apart_by_its_name_in_the_engine():
    """The engine asks a rule what it is (post_norm, routed_experts, takes_ridge, exact_at_k) and never compares
    its name: a new rule with the same declarations goes through every variant and fit unchanged."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "experiments" / "patching"
    names = "|".join(re.escape(key) for key in RULES) + "|" + "|".join(k.upper() for k in RULES)
    compare = re.compile(rf"(==|!=|\bin\b|\bnot in\b)\s*\(?\s*[\"']?({names})\b|\b({names})[\"']?\s*(==|!=)|"
                         r"output_rule\s*(==|!=|in\b|not in\b)|\.key\s*(==|!=|in\b)")
    loops = re.compile(r"\bfor\s+[\w, ]+\s+in\b")  # iterating over rules is not telling them apart
    found = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in sorted(root.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if compare.search(loops.sub("", line))]
    assert not found, "\n".join(found)


def test_a_rule_is_equal_to_itself_and_prints_its_name():
    from experiments.patching.rules import OUTER_WEIGHT, SCALE
    from experiments.patching.rules.outer_weight import OuterWeight

    assert OuterWeight() == OUTER_WEIGHT and hash(OuterWeight()) == hash(OUTER_WEIGHT) and OUTER_WEIGHT != SCALE
    assert str(SCALE) == "scale" and f"{OUTER_WEIGHT}" == "outer_weight"
    assert SCALE.post_norm and not OUTER_WEIGHT.post_norm and OUTER_WEIGHT.takes_ridge


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
