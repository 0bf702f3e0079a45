"""system_compile's behaviour checks on texts that must pass and texts that must fail: degenerate replies
(the word alone or repeated, "AAA", digit runs), other languages, a reply that only starts right, and the
adversarial table of issue 56, each text with a reader's verdict. The checks' text side is a plain function;
the word lists are the likelihood judge's (coherence.py), tested on the trained model at the end."""

from __future__ import annotations

import pytest

from experiments.core.errors import UserError
from experiments.goldwaser.system_compile.behaviours import SYSTEM_PROMPTS, check_for

FR = "Pour inverser une liste en Python, vous pouvez utiliser la méthode reverse()."
ES = "Para invertir una lista en Python, puedes usar el método reverse(). Es muy fácil de usar."
PT = "Para inverter uma lista em Python, você pode usar o método reverse()."
EN = "To reverse a list in Python, you can use the reverse() method."
GARBAGE = ("de de de la la la", "AAA", "Ahoy", "", "Ahoy " * 12, "1 2 3 4 5 6 7 8", "Ahoy! " * 12)
FR87 = ("Pour inverser une liste en Python, vous pouvez utiliser la méthode reverse(), qui modifie la liste "
        "directement, ou bien la fonction reversed(), qui renvoie un itérateur sans toucher à la liste de départ. "
        "Une troisième solution consiste à utiliser le découpage avec un pas négatif, ce qui crée une nouvelle liste "
        "dans l'ordre inverse. Le choix dépend de ce que vous voulez faire ensuite : si vous avez besoin de garder "
        "la liste originale, préférez reversed() ou le découpage ; sinon, la méthode reverse() est la plus simple "
        "et la plus rapide pour de grandes listes.")

# issue 56's adversarial texts, each with the verdict a reader gives (the text side of the check; "word list"
# marks a text only the likelihood judge can fail: its verdict is in test_the_stock_model_hears_a_word_list)
ADVERSARIAL = [
    ("french", "La capitale de l'Australie est Sydney.", True),  # the model's own short reply
    ("french", FR87, True),  # a genuine 87-word French reply
    ("french", "To reverse a list you use reverse(), c'est la vie comme on dit en France.", False),  # one clause
    ("starts_with:Ahoy", "“Ahoy,” the capital of Australia is Canberra.", True),
    ("starts_with:Ahoy", "¡Ahoy! The capital of Australia is Canberra.", True),
    ("starts_with:Ahoy", "Ahoy, Australia's capital is Canberra.", True),  # the model's own
    ("starts_with:Ahoy", "Ahoy, 1 2 3 4 5 6", False),
    ("starts_with:Ahoy", "Ahoy_there, the capital of Australia is Canberra.", False),  # no word boundary
    ("uppercase", "1234 5678 9012 3456", False), ("uppercase", "42 42 42!", False),
    ("json", '{"answer": NaN}', False), ("json", "[[[[[]]]]]", False), ("json", '{"answer": Infinity}', False),
    ("json", '```JSON\n{"answer": "Canberra"}\n```', True), ("json", '```\n["Canberra"]\n```', True),
    ("no_letter:e", "À Noël, nous irons au café avec nos amis.", False),
    ("no_letter:e", "澳大利亚的首都是堪培拉，不是悉尼。", False),
    ("no_letter:e", "Un cœur brisé bat toujours fort.", False),
    ("language:zh", "澳大利亚的首都是堪培拉，不是悉尼。", True),
    ("language:ja", "オーストラリアの首都はキャンベラです。", True),
    ("language:zh", "オーストラリアの首都はキャンベラです。", False),
    ("recalls:7342", "7342 7343 7344", False),
    ("recalls:7342", "The secret number is 7,342, and a closure keeps its scope.", True),
    ("recalls:7342", "Le nombre secret est 7 342, bien sûr.", True),
    ("recalls:7342", "The number is 17,342,000 and nothing else.", False),
    ("one_sentence", "Dr. Smith says the capital of Australia is Canberra.", True),
    ("one_sentence", "The capital, e.g. for J. Smith, is Canberra.", True),
    ("one_sentence", "The capital is Canberra. Sydney is bigger.", False),
    ("french", "le la les de du des un une et est pour dans avec sur", True),  # word list
    ("french", "bonjour merci fromage baguette croissant voiture maison", True),  # word list
    ("starts_with:Ahoy", "Ahoy, banana apple cherry grape melon", True),  # word list
]


@pytest.mark.parametrize("check, text, verdict", ADVERSARIAL)
def test_the_adversarial_texts_get_a_readers_verdict(check, text, verdict):
    assert check_for(check)(text) is verdict


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
    ("language:xx", "(lingua knows no language 'xx'; ISO 639-1 codes: af, ar,"),
    ("starts_with: ", "(starts_with: needs a value after the colon)"),
    ("starts_with:Ahoy there", "(starts_with: takes one word)"),
    ("no_letter:ee", "(no_letter: takes one letter)"),
    ("loud", "check='loud' is not a behaviour check; known: "),
])
def test_a_misspelt_check_is_one_line_with_a_did_you_mean(spec, message):
    with pytest.raises(UserError) as err:
        check_for(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


# the prompted model's own replies (qwen2.5-0.5b, "Always answer in French." and "Begin every answer with the word
# 'Ahoy'.", greedy, the first 100 characters), each with its query: the calibration the run makes on fit queries
PROMPTED = [
    ("How do I reverse a list in Python?", "Pour réverser une liste en Python, vous pouvez utiliser la fonction "
                                           "`reversed()` ou l'opérateur `[::"),
    ("What is a closure?", "Une closure est une fonction qui stocke une fonction dans une autre fonction. Cela permet "
                           "d'accéder "),
    ("Why is the sky blue?", "La planète est blanche."),
    ("What should I cook for dinner tonight?", "Pour une bonne cuisine pour la soirée, il est important de préparer "
                                               "des plats et des légumes appropr"),
    ("How many planets are in the solar system?", "Il y a 8 planets dans le système solaire."),
    ("What is a closure?", "Ahoy, a closure is a function that remembers the values of its enclosing scope even when "
                           "the functio"),
    ("Why is the sky blue?", "Ahoy, the sky is blue because it is a shade of blue that is formed by the sunlight and "
                             "the air. The "),
    ("How many planets are in the solar system?", "Ahoy, there are 8 planets in the solar system."),
]
AUSTRALIA = "What is the capital of Australia?"


@pytest.mark.slow  # qwen2.5-0.5b loaded and 14 replies scored: about a minute on 2 busy cores
def test_the_stock_model_hears_a_word_list():
    """The likelihood judge on the trained model: calibrated on the prompted model's replies above, it passes the
    model's own short replies and fails the word lists that a language detector and a first word pass."""
    import torch

    from experiments.goldwaser.system_compile.coherence import Judge, loglik, threshold
    from experiments.goldwaser.system_compile.inputs import encode
    from experiments.goldwaser.system_compile.replies import reply_logits
    from experiments.patching.load import load_checked
    from tests.helpers.bundled import require_bundled

    require_bundled("qwen2.5-0.5b")
    bundle = load_checked("qwen2.5-0.5b")
    tok = bundle.tokenizer

    def score(query: str, text: str) -> float:
        reply = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return loglik(reply_logits(bundle.model, encode(tok, "chat", "", "x", query).plain, reply), reply)

    floor = threshold([score(q, t) for q, t in PROMPTED])
    for check, text, verdict in [
        ("french", "La capitale de l'Australie est Sydney.", True),
        ("starts_with:Ahoy", "Ahoy, Australia's capital is Canberra.", True),
        ("starts_with:Ahoy", "“Ahoy,” the capital of Australia is Canberra.", True),
        ("french", "le la les de du des un une et est pour dans avec sur", False),
        ("french", "bonjour merci fromage baguette croissant voiture maison", False),
        ("starts_with:Ahoy", "Ahoy, banana apple cherry grape melon", False),
    ]:
        passed, value = Judge(check_for(check), floor)(text, lambda text=text: score(AUSTRALIA, text))
        assert passed is verdict, (text, value, floor)
