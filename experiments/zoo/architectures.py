"""The zoo's one window onto the architecture adapters above it (experiments/patching/arch/).

Only architectures that context patching can handle are worth loading: a model without an adapter would
be downloaded or converted, then refused. Which ones those are is the adapters' knowledge, and the
adapters sit above the zoo (patching imports the zoo). So the zoo asks them here and only here, inside
functions: at call time, never while a zoo module is imported. Importing the zoo therefore never imports
patching, and no import cycle can form; tests/zoo/test_layering.py allows this one lazy import out of
the zoo and no other. (A registry that patching fills when it is imported was the alternative; it makes
what the zoo accepts depend on what the caller happened to import first.)
"""

from __future__ import annotations


def require(model_type: str) -> None:
    """One line naming the supported architectures when `model_type` has no adapter."""
    from experiments.patching.arch import adapter_for

    adapter_for(model_type)


def known(model_type: str) -> bool:
    from experiments.patching.arch import ADAPTERS

    return model_type in ADAPTERS


def supported() -> str:
    """The supported `model_type`s, for messages."""
    from experiments.patching.arch import supported as names

    return names()
