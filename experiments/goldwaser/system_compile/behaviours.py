"""The system prompts and the code that checks their effect on a reply, as a reader would.

A check takes the reply's text and says whether the prompt's behaviour is there. Checks are named by a short
spec in the config (`french`, `language:es`, `starts_with:Ahoy`, `uppercase`, `json`, `no_letter:e`,
`ends_with:WORD`, `one_sentence`, `recalls:TEXT`), so a user's own system prompt can name one. Code blocks and
inline code are left out of every check but `json`.

Each check judges the reply, not its words. Its text side is here: the language by lingua on the reply's
clauses (language.py), a first word after any quotes or ¡ and with a word boundary after it, accents folded for
a lipogram (and a reply in a script without the letter refused), JSON by `json.loads` with NaN refused and a
fence in any case, a number with its thousands separators, a sentence end that is not an abbreviation's dot.
Every check but `json` also refuses a DEGENERATE reply: fewer than MIN_WORDS words, most words without a letter
(a digit run), or a word pair repeated through it (REPEATED_PAIRS; a word list or "Ahoy! Ahoy! Ahoy!"). What
a word list in the right language is, is the model's to say: a reply counts only when the stock model finds it
likely enough (coherence.py), which the run applies on top of the check. Plain string functions: no model."""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Callable

from experiments.core.errors import UserError
from experiments.goldwaser.system_compile.language import (
    LANGUAGE_SHARE,
    WORDISH,
    known_codes,
    language_of,
    language_share,
)

UPPERCASE_SHARE = 0.9  # of a reply's cased letters outside code blocks, for `uppercase`
MIN_CASED = 5  # ... of which it has at least this many (digits alone are not capitals)
MIN_WORDS = 3  # a reply has at least this many words outside code (a CJK character is a word) ...
MIN_LETTERED = 0.5  # ... at least this share of them with a letter ("Ahoy, 1 2 3 4 5 6" is not a reply) ...
REPEATED_PAIRS = 0.3  # ... and at most this share of its adjacent word pairs repeating an earlier pair
SCRIPT_SHARE = 0.9  # no_letter: of the reply's letters, in the letter's script (a CJK reply is no lipogram)
WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W\d_]+)?", re.UNICODE)
CODE_BLOCK = re.compile(r"```.*?(```|$)", re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
ABBREVIATIONS = {"dr", "mr", "mrs", "ms", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "cf", "approx", "no",
                 "fig", "eq", "vol", "inc", "ltd", "co", "mt", "jan", "feb", "aug", "sept", "oct", "nov", "dec", "ca",
                 "u.s", "u.k", "a.m", "p.m", "ph.d", "mme", "mlle", "sra", "núm", "z.b", "bzw"}
SENTENCE_END = re.compile(r"(?:[.!?…]+|[。！？]+)[\"'”’»)\]]*")
NUMBER = re.compile(r"(?<![\w.,])\d{1,3}(?:([,.\u202f\u00a0' _])\d{3})(?:\1\d{3})*(?![\d])|(?<![\w])\d+(?![\d])")


def prose(text: str) -> str:
    """The reply without its code blocks and inline code."""
    return INLINE_CODE.sub(" ", CODE_BLOCK.sub(" ", text))


def words(text: str) -> list[str]:
    """The prose's words, lowercased: runs of letters and digits (an apostrophe's suffix kept: "l'heure",
    "Australia's"), each CJK character a word."""
    return [w.lower() for w in WORDISH.findall(prose(text))]


def degenerate(text: str) -> str | None:
    """Why the prose is not a reply (None when it may be one): too few words, mostly words without a letter,
    or a word pair repeated through it. Not a judge of coherence (a word list passes here; coherence.py)."""
    w = words(text)
    if len(w) < MIN_WORDS:
        return f"fewer than {MIN_WORDS} words"
    if sum(any(c.isalpha() for c in x) for x in w) < MIN_LETTERED * len(w):
        return "mostly words without a letter"
    pairs = list(zip(w, w[1:], strict=False))
    if len(pairs) - len(set(pairs)) > REPEATED_PAIRS * len(pairs):
        return "a repeated word pair"
    return None


def in_language(code: str) -> Callable[[str], bool]:
    """The reply's prose is not degenerate and mostly in the language `code` (ISO 639-1; language.py)."""
    def check(text: str) -> bool:
        return degenerate(text) is None and language_share(prose(text), code) >= LANGUAGE_SHARE
    return check


def _after_leading_marks(text: str) -> str:
    """The text from its first letter or digit: markdown marks, quotes (“ « „ "), ¡ ¿ and spaces skipped."""
    for i, c in enumerate(text):
        if unicodedata.category(c)[0] in "LN":
            return text[i:]
    return ""


def starts_with(word: str) -> Callable[[str], bool]:
    """The reply's first word is `word` (case-insensitive; whatever is not a letter or digit before it skipped,
    a word boundary after it: "Ahoyhoy", "Ahoy's" do not start with Ahoy) and a reply follows it."""
    want = word.lower()

    def check(text: str) -> bool:
        body = _after_leading_marks(prose(text))
        first = WORD.match(body)
        return (first is not None and first.group(0).lower() == want and not re.match(r"\w", body[first.end():])
                and degenerate(body[first.end():]) is None)
    return check


def ends_with(word: str) -> Callable[[str], bool]:
    """A reply whose last word is `word` (case-insensitive; closing punctuation allowed) after a reply."""
    want = word.lower()

    def check(text: str) -> bool:
        w = [x.lower() for x in WORD.findall(prose(text))]
        return bool(w) and w[-1] == want and degenerate(" ".join(w[:-1])) is None
    return check


def fold(text: str) -> str:
    """Casefolded, accents taken off and ligatures written out: "À Noël, œuvre" -> "a noel, oeuvre"."""
    text = unicodedata.normalize("NFKD", text.casefold())
    text = "".join(c for c in text if not unicodedata.combining(c))
    return text.replace("œ", "oe").replace("æ", "ae").replace("ß", "ss").replace("ø", "o")


def _script(c: str) -> str:
    return unicodedata.name(c, "?").split(" ")[0]


def no_letter(letter: str) -> Callable[[str], bool]:
    """A lipogram: a reply written in the letter's script (SCRIPT_SHARE of its letters) whose prose never uses
    `letter`, in either case or under an accent (é, ë, È and œ hold an e)."""
    want, script = fold(letter), _script(letter)

    def check(text: str) -> bool:
        body = prose(text)
        letters = [c for c in body if c.isalpha()]
        return (degenerate(text) is None and sum(_script(c) == script for c in letters) >= SCRIPT_SHARE * len(letters)
                and want not in fold(body))
    return check


def _digits(number: str) -> str:
    return re.sub(r"\D", "", number)


def recalls(fact: str) -> Callable[[str], bool]:
    """A reply that states `fact` (a secret number or word; case-insensitive, as a whole token). A number is
    found with its thousands separators ("7,342", "7 342", "7.342") and not inside another number (73421)."""
    if re.fullmatch(r"\d+", fact):
        def check(text: str) -> bool:
            return degenerate(text) is None and any(_digits(m.group(0)) == fact for m in NUMBER.finditer(prose(text)))
        return check
    pattern = re.compile(rf"(?<!\w){re.escape(fact)}(?!\w)", re.IGNORECASE)

    def check_text(text: str) -> bool:
        return degenerate(text) is None and pattern.search(prose(text)) is not None
    return check_text


def is_uppercase(text: str) -> bool:
    """A reply whose cased letters outside code are capitals (UPPERCASE_SHARE), with at least MIN_CASED of them
    and most of its letters cased: digits alone, and a script without case, are not capitals."""
    letters = [c for c in prose(text) if c.isalpha()]
    cased = [c for c in letters if c.lower() != c.upper()]
    return (degenerate(text) is None and len(cased) >= MIN_CASED and len(cased) >= 0.5 * len(letters)
            and sum(c.isupper() for c in cased) >= UPPERCASE_SHARE * len(cased))


def sentences(body: str) -> list[str]:
    """The prose's sentences: cut after . ! ? … (and 。！？) followed by a space, unless the dot ends an
    abbreviation ("Dr.", "e.g.") or an initial ("J. Smith"), or the next word starts in lower case."""
    out, start = [], 0
    for m in SENTENCE_END.finditer(body):
        end, rest = m.end(), body[m.end():]
        cjk = m.group(0)[0] in "。！？"
        if not cjk and not (rest[:1].isspace() or not rest):
            continue
        token = re.findall(r"[\w.]+$", body[start:m.start()])
        before = token[0].lower().rstrip(".") if token else ""
        if m.group(0) == "." and (before in ABBREVIATIONS or (len(before) == 1 and before.isalpha())):
            continue
        following = rest.lstrip()[:1]
        if m.group(0) == "." and following.islower():
            continue
        out.append(body[start:end])
        start = end
    out.append(body[start:])
    return [x for x in out if WORD.search(x)]


def one_sentence(text: str) -> bool:
    """A reply of exactly one sentence (sentences(): abbreviations and initials do not end one)."""
    body = " ".join(prose(text).split())
    return degenerate(body) is None and len(sentences(body)) == 1


def _json_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def is_json(text: str) -> bool:
    """The whole reply parses (json.loads, NaN and Infinity refused) as a JSON object or array holding a value
    (`[[[]]]` holds none); a ``` fence around it, with json in any case or no tag, is allowed."""
    body = text.strip()
    fenced = re.fullmatch(r"```[ \t]*(?:json)?[ \t]*\n?(.*?)\s*```", body, re.DOTALL | re.IGNORECASE)
    if fenced:
        body = fenced.group(1)
    try:
        value = json.loads(body, parse_constant=_json_constant)
    except ValueError:
        return False
    return isinstance(value, (dict, list)) and _holds_value(value)


def _holds_value(value) -> bool:
    if isinstance(value, dict):
        return len(value) > 0
    if isinstance(value, list):
        return any(_holds_value(v) for v in value)
    return True


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
    if name == "language" and language_of(arg) is None:
        raise _refuse(spec, f" (lingua knows no language {arg!r}; ISO 639-1 codes: {', '.join(known_codes())})")
    if name in ("starts_with", "ends_with") and not WORD.fullmatch(arg):
        raise _refuse(spec, f" ({name}: takes one word)")
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
