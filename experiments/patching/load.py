"""A model for patching: the zoo's loader, told what patching knows (zoo/catalog.py's `Catalog`).

The zoo loads any causal LM by name and imports nothing of patching; patching sits above it and knows which
models are worth loading and whether an adapter describes the loaded layers. Everything that patches loads
through here:
- `check_patchable(name, dtype, device)`: before a run folder exists, the config can be had, its `model_type`
  has an adapter file or a module tree some Table 1 form fits (`require`, nothing loaded: the meta device),
  the model fits in memory;
- `load_checked(name, dtype, device, seed)`: the zoo's load, then the adapter checked against the stock decoder
  layers in float64 (`check_block`, arch/check.py), a structural guess's forms tried in turn;
- the offline names: the zoo's own random models and one tiny model per family (`RANDOM_OFFLINE_MODELS`,
  `TINY_ARCHITECTURES`), and what an adapter asks of `from_pretrained` (`implementation_kwargs`).
"""

from __future__ import annotations

import torch

from experiments.core.errors import UserError
from experiments.patching.arch import ADAPTERS, STRUCTURAL, TINY_MODELS, adapter_for, structure, supported
from experiments.patching.arch.check import check_adapter, choose_adapter
from experiments.zoo import loading
from experiments.zoo.bundle import ModelBundle
from experiments.zoo.catalog import Catalog


def require(config) -> None:
    """One line when `config.model_type` cannot be patched: it has no adapter file and its module tree fits
    no Table 1 form (arch/structure.py says what is missing). A tree that fits is put on trial, kept only if
    `check_block` passes once the model is loaded. Nothing is loaded here (the meta device)."""
    model_type = config.model_type
    if model_type in ADAPTERS:
        return
    # read again for every config: two checkpoints of one model_type may differ in structure (Gemma 4's sizes:
    # per-layer inputs or not, experts or not), and a sweep loads them in one process
    try:
        forms = structure.candidates(config)
    except structure.NoForm as why:
        STRUCTURAL.pop(model_type, None)
        raise UserError(f"model_type {model_type!r} has no context-patching adapter and its module tree fits no "
                        f"form of Table 1: {why}; with an adapter file: {supported()}") from None
    if not forms:
        raise UserError(f"model_type {model_type!r} has no context-patching adapter and no form of Table 1 fits "
                        f"its module tree; with an adapter file: {supported()}")
    STRUCTURAL[model_type] = forms


def check_block(model) -> None:
    """The model's adapter checked against its stock decoder layers (arch/check.py), once per layer structure:
    one line saying what differed when it misdescribes them. A structural guess's forms are tried in turn and
    the first that holds is kept; when none does, the guess is withdrawn."""
    model_type = model.config.model_type
    if model_type in ADAPTERS or model_type not in STRUCTURAL:
        check_adapter(model, adapter_for(model_type))  # no adapter: adapter_for's line naming the supported
        return
    try:
        STRUCTURAL[model_type] = [choose_adapter(model, STRUCTURAL[model_type])]
    except Exception:
        STRUCTURAL.pop(model_type, None)
        raise


def implementation_kwargs(config) -> dict:
    """What the family's adapter asks of the loader (Mixtral: experts run eagerly); a structural family's are its
    first form's, once `require` has read its tree."""
    model_type = config.model_type
    adapter = ADAPTERS.get(model_type) or next(iter(STRUCTURAL.get(model_type, ())), None)
    return dict(adapter.load_kwargs) if adapter else {}


CATALOG = Catalog(offline={name: adapter.tiny_config for name, adapter in TINY_MODELS.items()}, require=require,
                  load_kwargs=implementation_kwargs, check_loaded=check_block, supported=supported)
TINY_ARCHITECTURES = tuple(TINY_MODELS)  # one tiny random model per family, named by its record
RANDOM_OFFLINE_MODELS = loading.random_offline(CATALOG)  # the zoo's own and the families' tiny ones
FIX_HINT = loading.fix_hint("hub id", RANDOM_OFFLINE_MODELS)


def patched_parameter_count(config) -> int:
    """Parameters of every tensor a patch may write in every decoder layer (the input matrices, the output
    rule's parameter and, for a post-norm block, the matrix App. B and the closed loop condition), on the
    meta device: what a materialized update holds a patched copy of at once."""
    model = loading.meta_model(config)
    adapter = adapter_for(config.model_type)
    names = {*adapter.input_matrices, adapter.output_param, *([adapter.pre_norm_matrix] if adapter.pre_norm_matrix
                                                              else [])}
    return sum(layer.get_parameter(name).numel() for layer in adapter.layers(model) for name in names)


def check_patchable(name: str, dtype: torch.dtype, device: torch.device | str):
    """Everything that can be checked before a run folder exists (zoo/loading.check_model with patching's
    catalog): the config can be had, it can be patched, the model fits. Returns the config."""
    return loading.check_model(name, dtype, device, CATALOG)


def load_checked(name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 seed: int = 0) -> ModelBundle:
    """The model `name` in `dtype` on `device`, in eval mode, its adapter checked against its stock layers."""
    return loading.load_model(name, dtype, device, seed, CATALOG)


def offline_config(name: str):
    """The config of an offline model, the families' tiny ones included, without building it."""
    return loading.offline_config(name, CATALOG)


def build_offline(name: str, seed: int):
    """(model, tokenizer, processor) of one of RANDOM_OFFLINE_MODELS, in float32, weights drawn from `seed`."""
    return loading.build_offline(name, seed, CATALOG)


def weights_kind(name: str) -> str:
    """trained, random, local or hub (zoo/loading.weights_kind), the families' tiny models being random."""
    return loading.weights_kind(name, CATALOG)


def model_label(name: str) -> str:
    """`tiny-llama (random)`: what run.json and the report say a run's claims were measured on."""
    return loading.model_label(name, CATALOG)
