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


def require(config) -> None:
    """One line naming the supported architectures when `config.model_type` has no adapter, unless its decoder
    layer has Llama's module names: then the Llama adapter is put on trial for it (patching/arch/llama_style.py),
    kept only if `check_block` passes once the model is loaded. Nothing is loaded here (the meta device)."""
    from experiments.patching.arch import ADAPTERS, LLAMA_STYLE, adapter_for
    from experiments.patching.arch.llama_style import llama_style_adapter

    model_type = config.model_type
    if model_type not in ADAPTERS and model_type not in LLAMA_STYLE:
        trial = llama_style_adapter(config)
        if trial is not None:
            LLAMA_STYLE[model_type] = trial
    adapter_for(model_type)


def check_block(model) -> None:
    """The model's adapter checked against its stock decoder layers (patching/arch/check.py), once per layer
    structure: one line saying what differed when it misdescribes them; a Llama-style trial that fails is
    withdrawn."""
    from experiments.patching.arch import LLAMA_STYLE, adapter_for
    from experiments.patching.arch.check import check_adapter

    model_type = model.config.model_type
    try:
        check_adapter(model, adapter_for(model_type))
    except Exception:
        LLAMA_STYLE.pop(model_type, None)
        raise


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
