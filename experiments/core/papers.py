"""The papers the tool reproduces: one package under experiments/ each, in the order `icl-exp list` and the
report show them. Its own module so that the registry (experiments) and the config schemas (their schema.py)
both read it without importing each other."""

PAPER_PACKAGES = ("dherin", "goldwaser", "karbevski", "xu_fang")
