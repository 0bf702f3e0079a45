"""Which language a reply is in, as a reader judges it: lingua (lingua-language-detector, a maintained detector
made for short and mixed text, 75 languages in every script, CJK included, offline) on each clause of the
reply's prose, each clause weighted by its words. A reply passes `language:CODE` when the clauses in CODE hold
at least LANGUAGE_SHARE of the words of the clauses lingua is sure of (its two best languages at least
MIN_DISTANCE apart; "Para inverter uma lista em Python," could be Spanish or Portuguese and counts for neither):
an English sentence with one French clause is not French, a French reply with an English technical term is.
When it is sure of no clause (a short reply: "La capitale de l'Australie est Sydney."), the whole prose's
most likely language decides. Counting function words, or a distinct-word share, passes a word list and
fails a long genuine reply; a word list's likelihood is the coherence judge's (coherence.py)."""

from __future__ import annotations

import re
from functools import cache

LANGUAGE_SHARE = 2 / 3  # of a reply's words (in clauses the detector is sure of), in the wanted language
MIN_DISTANCE = 0.05  # lingua's minimum relative distance for a clause's verdict
MIN_CLAUSE_WORDS = 4  # a shorter clause is read with the one before it (two words say little about a language)
CLAUSE_END = re.compile(r"(?<=[.!?;:,。！？；：，、])\s*|\n+")
CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
WORDISH = re.compile(rf"[{CJK}]|[^\W\d_{CJK}]+|\d+", re.UNICODE)  # a CJK character counts as a word


def word_count(text: str) -> int:
    return len(WORDISH.findall(text))


@cache
def detector(sure: bool = False):
    """Every language lingua knows, its models loaded on first use (about 1 GB and 8 s, once a process); `sure`:
    one that answers None where its two best languages are closer than MIN_DISTANCE."""
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages()
    return (builder.with_minimum_relative_distance(MIN_DISTANCE) if sure else builder).build()


def language_of(code: str):
    """lingua's Language for an ISO 639-1 code, or None when it knows none."""
    from lingua import IsoCode639_1, Language

    try:
        return Language.from_iso_code_639_1(IsoCode639_1.from_str(code.lower()))
    except (ValueError, AttributeError, KeyError):
        return None


def known_codes() -> list[str]:
    from lingua import Language

    return sorted(lang.iso_code_639_1.name.lower() for lang in Language.all())


def clauses(prose: str) -> list[str]:
    """The prose cut at sentence and clause ends, a clause of fewer than MIN_CLAUSE_WORDS words joined to the
    one before it (or the next, at the start)."""
    parts = [p.strip() for p in CLAUSE_END.split(prose) if p and p.strip()]
    out: list[str] = []
    for part in parts:
        if out and (word_count(part) < MIN_CLAUSE_WORDS or word_count(out[-1]) < MIN_CLAUSE_WORDS):
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out


def language_share(prose: str, code: str) -> float:
    """The share of the words of the clauses lingua is sure of that are in clauses of the language `code`; with
    no clause it is sure of, 1 or 0 as the whole prose's most likely language is `code` or not; 0 for no words."""
    want = language_of(code)
    total = hit = 0
    for clause in clauses(prose):
        n, lang = word_count(clause), detector(sure=True).detect_language_of(clause)
        if n and lang is not None:
            total += n
            hit += n * (lang == want)
    if total:
        return hit / total
    return float(word_count(prose) > 0 and detector().detect_language_of(prose) == want)
