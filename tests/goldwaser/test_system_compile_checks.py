"""system_compile's behaviour checks on texts that must pass and texts that must fail: degenerate replies
(a word list, the word alone or repeated, "AAA"), other languages, and a reply that only starts right."""

from __future__ import annotations

import pytest

from experiments.core.errors import UserError
from experiments.goldwaser.system_compile.behaviours import SYSTEM_PROMPTS, check_for

FR = "Pour inverser une liste en Python, vous pouvez utiliser la méthode reverse()."
ES = "Para invertir una lista en Python, puedes usar el método reverse(). Es muy fácil de usar."
PT = "Para inverter uma lista em Python, você pode usar o método reverse()."
EN = "To reverse a list in Python, you can use the reverse() method."
GARBAGE = ("de de de la la la", "x de y la zzz qqq", "AAA", "Ahoy ahoy garbage zz", "Ahoy", "", "Ahoy " * 12)


@pytest.mark.parametrize("check, text", [
    ("french", FR), ("french", "Le ciel est bleu parce que l'air diffuse la lumière bleue."),
    ("french", "```python\nx = [1, 2]\nx.reverse()\n```\n" + FR),  # code blocks are left out
    ("language:es", ES), ("language:pt", PT), ("language:en", EN),
    ("starts_with:Ahoy", "Ahoy, a closure is a function that remembers its scope."),
    ("starts_with:Ahoy", "**Ahoy!** Here is how you reverse a list."),
    ("uppercase", "A CLOSURE IS A FUNCTION THAT REMEMBERS ITS SCOPE."),
    ("uppercase", "USE `sorted(d.items())` TO SORT THE ITEMS OF A DICTIONARY."),  # inline code left out
    ("json", '```json\n{"answer": 42}\n```'), ("json", '[{"step": 1}]'),
    ("no_letter:e", "A list turns around with its own built-in call, which is handy."),
    ("ends_with:Amen", "A closure is a function that keeps its scope. Amen."),
    ("one_sentence", "A closure is a function that keeps the variables of its scope alive."),
    ("recalls:7342", "The secret number is 7342, and a closure keeps its scope."),
])
def test_checks_pass_a_real_reply_with_the_behaviour(check, text):
    assert check_for(check)(text) is True


@pytest.mark.parametrize("check, text", [
    ("french", EN), ("french", ES), ("french", PT),
    ("french", "```python\nle = la = les = 1\n```\nThis is the way to do it."),  # French-looking code
    ("language:es", PT), ("language:es", FR), ("language:pt", ES),
    ("starts_with:Ahoy", "Sure! Ahoy, here is how you do it."),
    ("starts_with:Ahoy", "Ahoyhoy there, a closure is a thing."),
    ("starts_with:Ahoy", "Ahoy ahoy ahoy ahoy ahoy ahoy"), ("starts_with:Ahoy", "Ahoy! Ahoy! Ahoy! Ahoy! Ahoy!"),
    ("uppercase", "A closure is a function that remembers its scope."),
    ("uppercase", "AAA AAA AAA AAA AAA AAA"),
    ("json", '{"answer": 42'), ("json", "42"), ("json", "{}"), ("json", "[]"),
    ("no_letter:e", "A closure is a function that remembers its scope."),
    ("ends_with:Amen", "A closure is a function that keeps its scope."), ("ends_with:Amen", "Amen amen amen amen"),
    ("one_sentence", "A closure is a function. It keeps its scope alive for later calls."),
    ("recalls:7342", "A closure is a function that keeps its scope."), ("recalls:7342", "73421 is not the number."),
])
def test_checks_fail_a_reply_without_the_behaviour(check, text):
    assert check_for(check)(text) is False


@pytest.mark.parametrize("check", sorted({c for _, _, c in SYSTEM_PROMPTS} | {"language:pt"}))
@pytest.mark.parametrize("text", GARBAGE)
def test_no_check_passes_garbage(check, text):
    """The texts a word list or a regex passes: degenerate, a word alone or repeated, three capitals."""
    assert check_for(check)(text) is False


def test_the_suite_has_six_behaviours_of_distinct_checks():
    assert len({c.split(":")[0] for _, _, c in SYSTEM_PROMPTS}) >= 6


@pytest.mark.parametrize("spec, message", [
    ("frnech", "check='frnech' is not a behaviour check; did you mean french? known: french, language:CODE"),
    ("starts_wth:Ahoy", "did you mean starts_with:…?"),
    ("starts_with:", "(starts_with: needs a value after the colon)"),
    ("language:xx", "(py3langid knows no language 'xx')"),
    ("no_letter:ee", "(no_letter: takes one letter)"),
    ("loud", "check='loud' is not a behaviour check; known: "),
])
def test_a_misspelt_check_is_one_line_with_a_did_you_mean(spec, message):
    with pytest.raises(UserError) as err:
        check_for(spec)
    assert message in str(err.value) and "\n" not in str(err.value)
