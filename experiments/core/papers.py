"""The papers the tool reproduces: one package under experiments/ each, in the order `icl-exp list` and the
report show them, and which of them an experiment lives in. Its own module so that the registry (experiments)
and the config schemas (their schema.py) both read it without importing each other."""

import importlib.util

PAPER_PACKAGES = ("dherin", "goldwaser", "karbevski", "xu_fang")


def experiment_module(name: str) -> str | None:
    """The module of experiment `name`, experiments/<paper>/<name>.py or the package <name>/, found without
    importing it; None when no paper has one."""
    for package in PAPER_PACKAGES:
        candidate = f"experiments.{package}.{name}"
        if importlib.util.find_spec(f"experiments.{package}") and importlib.util.find_spec(candidate):
            return candidate
    return None
