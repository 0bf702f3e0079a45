"""The zoo's one window onto the architecture adapters above it (experiments/patching/arch/).

Only architectures that context patching can handle are worth loading: a model without an adapter would
be downloaded or converted, then refused. Which ones those are, what each needs from the loader and each
tiny test model's config are the adapters' knowledge, and the adapters sit above the zoo (patching
imports the zoo). So the zoo asks them here and only here, inside functions. loading.py asks once when
it is imported, for the offline names (`tiny_models`); the rest of the zoo, which patching uses, never
imports patching, and the cycle test keeps patching from importing loading.py. tests/zoo/test_layering.py
allows this one lazy import out of the zoo and no other. (A registry that patching fills when it is
imported was the alternative; it makes what the zoo accepts depend on what the caller imported first.)
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


def tiny_models() -> tuple[str, ...]:
    """The offline names of the adapters' tiny random test models, in registry order."""
    from experiments.patching.arch import TINY_MODELS

    return tuple(TINY_MODELS)


def tiny_config(name: str, vocab_size: int):
    """The transformers config of the tiny test model `name`, as its adapter carries it."""
    from experiments.patching.arch import TINY_MODELS

    return TINY_MODELS[name].tiny_config(vocab_size)


def load_kwargs(model_type: str) -> dict:
    """What the architecture's adapter asks of the loader (e.g. Mixtral: experts run eagerly)."""
    from experiments.patching.arch import ADAPTERS

    adapter = ADAPTERS.get(model_type)
    return dict(adapter.load_kwargs) if adapter else {}
