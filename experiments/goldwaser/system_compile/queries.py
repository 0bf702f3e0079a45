"""The default pool of user queries (queries.txt, one a line): what a user of a small assistant asks, coding
and everyday questions, short enough that a reply of a few dozen tokens already shows a system prompt's
effect. The last `heldout=` are held out."""

from __future__ import annotations

from pathlib import Path

QUERIES_FILE = Path(__file__).with_name("queries.txt")
QUERIES = tuple(line.strip() for line in QUERIES_FILE.read_text(encoding="utf-8").splitlines() if line.strip())
