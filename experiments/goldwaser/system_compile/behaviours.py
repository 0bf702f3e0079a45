"""The system prompts and the code that checks their effect on a reply.

A check takes the reply's text and says whether the prompt's behaviour is there: a reply in French, a
fixed first word, capital letters, valid JSON. Checks are named by a short spec in the config
(`french`, `starts_with:Ahoy`, `uppercase`, `json`), so a user's own system prompt can name one.
Plain string functions: no model, no torch."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from experiments.core.errors import UserError

# Frequent function words, lowercased: a reply is French when it uses more French ones than English ones.
# Code in a reply (identifiers, keywords) rarely hits either list; the prose around it decides.
FRENCH_WORDS = frozenset(
    "le la les un une des du de et est sont pour dans que qui avec vous nous pas sur au aux ce cette ces "
    "il elle ils on votre vos leur mais ou comme par plus peut être fait voici cela ceci très aussi".split())
ENGLISH_WORDS = frozenset(
    "the a an and is are for in that which with you we not on at this these it they your their but or "
    "as by more can be does here very also of to".split())
UPPERCASE_SHARE = 0.9  # of a reply's letters outside code blocks, for `uppercase`
WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)
CODE_BLOCK = re.compile(r"```.*?(```|$)", re.DOTALL)
LEADING_MARKS = " \t\n*_#>\"'`"  # skipped before a first word


def _words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(CODE_BLOCK.sub(" ", text))]


def is_french(text: str) -> bool:
    words = _words(text)
    french = sum(w in FRENCH_WORDS or w.startswith(("l'", "d'", "qu'", "c'", "n'")) for w in words)
    english = sum(w in ENGLISH_WORDS for w in words)
    return french >= 2 and french > english


def starts_with(word: str) -> Callable[[str], bool]:
    """The reply's first word is `word` (case-insensitive; markdown marks and quotes before it are skipped)."""
    want = word.lower()

    def check(text: str) -> bool:
        first = WORD.match(text.lstrip(LEADING_MARKS))
        return first is not None and first.group(0).lower() == want
    return check


def is_uppercase(text: str) -> bool:
    letters = [c for c in CODE_BLOCK.sub(" ", text) if c.isalpha()]
    return len(letters) >= 3 and sum(c.isupper() for c in letters) >= UPPERCASE_SHARE * len(letters)


def is_json(text: str) -> bool:
    """The whole reply parses as a JSON object or array (a ```json fence around it is allowed)."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        return isinstance(json.loads(body), (dict, list))
    except ValueError:
        return False


CHECKS: dict[str, Callable[[str], bool]] = {"french": is_french, "uppercase": is_uppercase, "json": is_json}
CHECK_FORMS = ("french", "starts_with:WORD", "uppercase", "json")


def check_for(spec: str) -> Callable[[str], bool]:
    """The check a spec names; one line listing the forms when it names none."""
    spec = str(spec).strip()
    if spec.startswith("starts_with:") and spec.split(":", 1)[1].strip():
        return starts_with(spec.split(":", 1)[1].strip())
    if spec in CHECKS:
        return CHECKS[spec]
    raise UserError(f"check={spec!r} is not a behaviour check; known: {', '.join(CHECK_FORMS)}")


# (name, system prompt, check). Qwen2.5-Coder-0.5B-Instruct follows the first two (French replies to Python
# questions, "Ahoy, ..."); the last two it mostly ignores: the reference's pass rate says so in each run.
SYSTEM_PROMPTS = (
    ("french", "Always answer in French.", "french"),
    ("ahoy", "Begin every answer with the word 'Ahoy'.", "starts_with:Ahoy"),
    ("capitals", "Answer in capital letters only.", "uppercase"),
    ("json", "Reply only with valid JSON.", "json"),
)
