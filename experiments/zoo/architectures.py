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
    """One line when `config.model_type` cannot be patched: it has no adapter file and its module tree fits
    no Table 1 form (patching/arch/structure.py says what is missing). A tree that fits is put on trial,
    kept only if `check_block` passes once the model is loaded. Nothing is loaded here (the meta device)."""
    from experiments.core.errors import UserError
    from experiments.patching.arch import ADAPTERS, STRUCTURAL, supported
    from experiments.patching.arch.structure import NoForm, candidates

    model_type = config.model_type
    if model_type in ADAPTERS:
        return
    # read again for every config: two checkpoints of one model_type may differ in structure (Gemma 4's sizes:
    # per-layer inputs or not, experts or not), and a sweep loads them in one process
    try:
        forms = candidates(config)
    except NoForm as why:
        STRUCTURAL.pop(model_type, None)
        raise UserError(f"model_type {model_type!r} has no context-patching adapter and its module tree fits no "
                        f"form of Table 1: {why}; with an adapter file: {supported()}") from None
    if not forms:
        raise UserError(f"model_type {model_type!r} has no context-patching adapter and no form of Table 1 fits "
                        f"its module tree; with an adapter file: {supported()}")
    STRUCTURAL[model_type] = forms


def check_block(model) -> None:
    """The model's adapter checked against its stock decoder layers (patching/arch/check.py), once per layer
    structure: one line saying what differed when it misdescribes them. A structural guess's forms are tried
    in turn and the first that holds is kept; when none does, the guess is withdrawn."""
    from experiments.patching.arch import ADAPTERS, STRUCTURAL
    from experiments.patching.arch.check import check_adapter, choose_adapter

    model_type = model.config.model_type
    if model_type in ADAPTERS or model_type not in STRUCTURAL:
        check_adapter(model, ADAPTERS[model_type] if model_type in ADAPTERS else _missing(model_type))
        return
    try:
        STRUCTURAL[model_type] = [choose_adapter(model, STRUCTURAL[model_type])]
    except Exception:
        STRUCTURAL.pop(model_type, None)
        raise


def _missing(model_type: str):
    from experiments.patching.arch import adapter_for

    return adapter_for(model_type)  # raises the one line naming the supported ones


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
    from experiments.patching.arch import ADAPTERS, STRUCTURAL

    adapter = ADAPTERS.get(model_type) or next(iter(STRUCTURAL.get(model_type, ())), None)
    return dict(adapter.load_kwargs) if adapter else {}
