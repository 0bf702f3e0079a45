"""The registry's trained models (the chunk packages of experiments/zoo/bundled_gguf.py) in a test."""

from __future__ import annotations

import os

import pytest

from tests.helpers.repo import setup_extras


def require_bundled(name: str) -> None:
    """Skip, in one line naming the extra, when the chunk packages of the bundled model `name` are not
    installed, except in CI (CI=true) for a model of the set-up's default extras, which `nox -s tests`
    installs, so that a skip would hide a broken set-up (an opt-in model, such as the 1.5B, skips there too)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from experiments.zoo.bundled_gguf import BUNDLED

    model = BUNDLED[name]
    try:
        for dist, _ in model.chunks:
            distribution(dist)
    except PackageNotFoundError:
        why = f"model={name} needs its chunk packages: {model.install_hint}"
        if os.environ.get("CI", "").lower() in ("1", "true") and model.extra in setup_extras():
            pytest.fail(why)
        pytest.skip(why)
