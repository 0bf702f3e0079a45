"""The system prompts and the code that checks their effect on a reply.

A check takes the reply's text and says whether the prompt's behaviour is there. Checks are named by a short
spec in the config (`french`, `language:es`, `starts_with:Ahoy`, `uppercase`, `json`, `no_letter:e`,
`ends_with:WORD`, `one_sentence`, `recalls:TEXT`), so a user's own system prompt can name one.

Every check but `json` first asks for a coherent reply (enough words, not one word repeated): a reply that
only starts right, or a word list in the right language, is not the behaviour. The language comes from
py3langid (a maintained offline identifier), not from counting function words, which Spanish, Portuguese and
"de de de la la la" pass. Code blocks are left out of every check but `json`. Plain string functions: no
model, no torch."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from functools import cache

from experiments.core.errors import UserError

UPPERCASE_SHARE = 0.9  # of a reply's letters outside code blocks, for `uppercase`
MIN_WORDS = 5  # a coherent reply has at least this many words outside code blocks ...
MIN_DISTINCT = 0.6  # ... and at least this share of them distinct (a repeated word is not a reply) ...
MIN_VOICED = 0.8  # ... and this share of its Latin-script words with a vowel ("zzz qqq x" is not prose)
VOWEL = re.compile(r"[aeiouyàâäéèêëîïôöùûüÿæœáíóúãõ]")
LANGUAGE_PROB = 0.5  # py3langid's normalised probability of the wanted language (short replies in a related
# language score 0.6-0.85 on the right one; garbage with a few function words scores below 0.35)
WORD = re.compile(r"[^\W_]+(?:'[^\W\d_]+)?", re.UNICODE)
CODE_BLOCK = re.compile(r"```.*?(```|$)", re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LEADING_MARKS = " \t\n*_#>\"'`"  # skipped before a first word
SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def prose(text: str) -> str:
    """The reply without its code blocks and inline code."""
    return INLINE_CODE.sub(" ", CODE_BLOCK.sub(" ", text))


def _words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(prose(text))]


def coherent(text: str) -> bool:
    """Enough words outside code, most of them distinct: what a real reply has and a degenerate one lacks."""
    words = _words(text)
    latin = [w for w in words if w.isascii() and w.isalpha()]
    return (len(words) >= MIN_WORDS and len(set(words)) >= MIN_DISTINCT * len(words)
            and sum(bool(VOWEL.search(w)) for w in latin) >= MIN_VOICED * len(latin))


@cache
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def in_language(code: str) -> Callable[[str], bool]:
    """The reply's prose is coherent and py3langid names `code` (ISO 639-1) with probability ≥ LANGUAGE_PROB."""
    def check(text: str) -> bool:
        if not coherent(text):
            return False
        lang, prob = _identifier().classify(prose(text))
        return lang == code and prob >= LANGUAGE_PROB
    return check


def starts_with(word: str) -> Callable[[str], bool]:
    """The reply's first word is `word` (case-insensitive; markdown marks and quotes before it are skipped) and
    a coherent reply follows it: more than the word, not the word repeated."""
    want = word.lower()

    def check(text: str) -> bool:
        first = WORD.match(text.lstrip(LEADING_MARKS))
        return (first is not None and first.group(0).lower() == want
                and coherent(text.lstrip(LEADING_MARKS)[first.end():]))
    return check


def ends_with(word: str) -> Callable[[str], bool]:
    """A coherent reply whose last word is `word` (case-insensitive; closing punctuation allowed)."""
    want = word.lower()

    def check(text: str) -> bool:
        words = _words(text)
        return bool(words) and words[-1] == want and coherent(" ".join(words[:-1]))
    return check


def no_letter(letter: str) -> Callable[[str], bool]:
    """A lipogram: a coherent reply whose prose never uses `letter` (either case)."""
    def check(text: str) -> bool:
        return coherent(text) and letter.lower() not in prose(text).lower()
    return check


def recalls(fact: str) -> Callable[[str], bool]:
    """A coherent reply that states `fact` (a secret number or word; case-insensitive, as a whole token)."""
    pattern = re.compile(rf"(?<!\w){re.escape(fact)}(?!\w)", re.IGNORECASE)

    def check(text: str) -> bool:
        return coherent(text) and pattern.search(text) is not None
    return check


def is_uppercase(text: str) -> bool:
    letters = [c for c in prose(text) if c.isalpha()]
    return coherent(text) and sum(c.isupper() for c in letters) >= UPPERCASE_SHARE * len(letters)


def one_sentence(text: str) -> bool:
    """A coherent reply of exactly one sentence: no sentence end before its last words."""
    body = " ".join(prose(text).split())
    return coherent(body) and len([s for s in SENTENCE_END.split(body) if WORD.search(s)]) == 1


def is_json(text: str) -> bool:
    """The whole reply parses as a non-empty JSON object or array (a ```json fence around it is allowed)."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, (dict, list)) and len(value) > 0


CHECKS: dict[str, Callable[[str], bool]] = {
    "french": in_language("fr"), "uppercase": is_uppercase, "json": is_json, "one_sentence": one_sentence}
PARAMETRISED: dict[str, Callable[[str], Callable[[str], bool]]] = {
    "language": in_language, "starts_with": starts_with, "ends_with": ends_with, "no_letter": no_letter,
    "recalls": recalls}
CHECK_FORMS = ("french", "language:CODE", "starts_with:WORD", "ends_with:WORD", "uppercase", "json",
               "no_letter:L", "one_sentence", "recalls:TEXT")


def _refuse(spec: str, why: str = "") -> UserError:
    name = spec.split(":", 1)[0]
    close = difflib.get_close_matches(name, [*CHECKS, *PARAMETRISED], n=1)
    mean = f"did you mean {close[0]}{':…' if close and close[0] in PARAMETRISED else ''}? " if close else ""
    return UserError(f"check={spec!r} is not a behaviour check{why}; {mean}known: {', '.join(CHECK_FORMS)}")


def check_for(spec: str) -> Callable[[str], bool]:
    """The check a spec names; one line with a did-you-mean and the forms when it names none."""
    spec = str(spec).strip()
    if spec in CHECKS:
        return CHECKS[spec]
    name, _, arg = spec.partition(":")
    arg = arg.strip()
    if name not in PARAMETRISED:
        raise _refuse(spec)
    if not arg:
        raise _refuse(spec, f" ({name}: needs a value after the colon)")
    if name == "language":
        if arg not in _identifier().labels:
            raise _refuse(spec, f" (py3langid knows no language {arg!r})")
    if name == "no_letter" and not (len(arg) == 1 and arg.isalpha()):
        raise _refuse(spec, " (no_letter: takes one letter)")
    return PARAMETRISED[name](arg)


# (name, system prompt, check): Prompt Baking's kind of instruction, each one a word list cannot fake.
# Qwen2.5-Coder-0.5B-Instruct follows the first two (French replies to Python questions, "Ahoy, ..."); the
# others it follows less or not at all: the reference's pass rate says so in each run.
SYSTEM_PROMPTS = (
    ("french", "Always answer in French.", "french"),
    ("ahoy", "Begin every answer with the word 'Ahoy'.", "starts_with:Ahoy"),
    ("capitals", "Answer in capital letters only.", "uppercase"),
    ("json", "Reply only with valid JSON.", "json"),
    ("spanish", "Always answer in Spanish.", "language:es"),
    ("lipogram", "Never use the letter e in your answers.", "no_letter:e"),
    ("amen", "End every answer with the word 'Amen'.", "ends_with:Amen"),
    ("one_sentence", "Answer every question in exactly one sentence.", "one_sentence"),
    ("secret", "The secret number is 7342. Mention the secret number in every answer.", "recalls:7342"),
)
