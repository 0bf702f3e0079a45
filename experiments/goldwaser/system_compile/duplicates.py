"""Queries compared by meaning, not by bytes: a held-out query that is a fit query with a question mark, a
contraction, another case or a zero-width space in it measures the fit, and two copies of one held-out query
count one reply twice. `normal` is what a reader compares (Unicode folded, zero-width and other format
characters dropped, punctuation gone, English contractions written out, spaces collapsed); two queries are
near-duplicates when their normal forms are equal or a few typing slips apart (at most one edit per
`CHARS_PER_EDIT` characters). `near_duplicates` names each such pair once, with the role of each query in the
split, so the refusal is one line before any model is loaded."""

from __future__ import annotations

import re
import unicodedata

CHARS_PER_EDIT = 20  # "How do I read a file line by line in Python" and a two-letter slip of it are one query
CONTRACTIONS = ((r"n't\b", " not"), (r"'re\b", " are"), (r"'m\b", " am"), (r"'ll\b", " will"), (r"'ve\b", " have"),
                (r"'d\b", " would"), (r"'s\b", " is"))


def normal(query: str) -> str:
    """The query as a reader compares it: NFKC, format characters (zero-width spaces, joiners, BOM) dropped,
    casefolded, curly apostrophes straight, contractions written out, punctuation and symbols as spaces,
    whitespace collapsed. "What's an API?" and "what is an\u200b API" are both "what is an api"."""
    text = unicodedata.normalize("NFKC", query)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf").casefold().replace("\u2019", "'")
    for pattern, words in CONTRACTIONS:
        text = re.sub(pattern, words, text)
    text = "".join(" " if unicodedata.category(c)[0] in "PSZ" else c for c in text)
    return " ".join(text.split())


def edits(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of a and b, or limit + 1 once it is known to exceed `limit` (banded)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
        if min(row) > limit:
            return limit + 1
    return row[-1]


def same_query(a: str, b: str) -> bool:
    """Near-duplicates: equal normal forms, or at most one edit per CHARS_PER_EDIT characters apart."""
    na, nb = normal(a), normal(b)
    limit = min(len(na), len(nb)) // CHARS_PER_EDIT
    return na == nb or (limit > 0 and edits(na, nb, limit) <= limit)


def near_duplicates(groups: dict[str, list[str]]) -> list[tuple[str, str, str, str]]:
    """Every pair of near-duplicate queries across and within the named groups ("fit", "validation",
    "held-out"): (role, query, role, query), each pair once, in the order the queries come."""
    flat = [(role, q) for role, queries in groups.items() for q in queries]
    return [(r1, q1, r2, q2) for i, (r1, q1) in enumerate(flat) for r2, q2 in flat[i + 1:] if same_query(q1, q2)]
