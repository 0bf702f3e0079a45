"""A model's check kept for its load, within one plain run's job (`checks_kept`, which cli/hydra_app.py opens around
the job's checks and its run): the job checks its model once, in its validate before run.json, and its load
(zoo/loading.load_model) takes that check instead of making it again. Each check is taken once; a model loaded
without one (a second dtype, the Python API, a test, a sweep's job) is checked at its load. Not across a sweep's
jobs: a check also records a structural family's forms for its config's model_type (patching/load.require),
which the last job checked would hold for every job's load (Gemma 4's sizes differ in structure under one
model_type), so a sweep's job checks again at its load. Nothing outlives the scope. Imports nothing."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

_scopes: list[dict[Hashable, list]] = []


@contextmanager
def checks_kept() -> Iterator[None]:
    _scopes.append({})
    try:
        yield
    finally:
        _scopes.pop()


def keep(key: Hashable, config) -> None:
    """A check's answer for `key` (model, dtype, device), kept for one load in the open scope (none: dropped)."""
    if _scopes:
        _scopes[-1].setdefault(key, []).append(config)


def take(key: Hashable):
    """The oldest kept answer for `key`, taken; None where there is none (the load then checks)."""
    kept = _scopes[-1].get(key) if _scopes else None
    return kept.pop(0) if kept else None
