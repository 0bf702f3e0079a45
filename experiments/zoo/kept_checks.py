"""A model's check kept for its load, within one command's jobs (`checks_kept`, which cli/launch.py opens around a
command's checks and the jobs this process runs): each job checks its model once, before any run folder (a plain
run in its job, a sweep's jobs all in the CLI before the first begins), and its load (zoo/loading.load_model)
takes that check instead of making it again. Each check is taken once, in the order made; a model loaded without
one (a second dtype, the Python API, a test, a job in a launcher's other process) is checked at its load.
Nothing outlives the scope, so no check made for one command (or one test) is taken by another's load. Imports
nothing: the CLI opens the scope before it knows whether torch will be needed."""

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
