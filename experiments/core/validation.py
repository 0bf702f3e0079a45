"""Config checks shared by the experiments' `validate()` functions."""

from __future__ import annotations

import functools

from experiments.core.errors import UserError


def require_positive(cfg, *keys: str) -> None:
    """Each dotted key (e.g. "train.steps") of the typed config must be at least 1 (its type, an integer,
    the schema already holds)."""
    for key in keys:
        value = functools.reduce(getattr, key.split("."), cfg)
        if value < 1:
            raise UserError(f"{key}={value} must be at least 1")
