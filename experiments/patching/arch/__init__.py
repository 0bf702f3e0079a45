"""One adapter per architecture, keyed on transformers' `config.model_type`.

Adding an architecture: its record in patching/families.py's FAMILY_TABLE (its name, model types, theorem and
tiny model, written there alone), and its adapter file here (a `BlockAdapter` of its record's fields,
`said_by(module)`, naming its Table 1 rule and carrying its tiny test config; for a block Llama's adapter
already describes, `dataclasses.replace` of it, as qwen3.py). FAMILIES is read from the table. The offline
tiny model, the parametrized tests over TINY_MODELS, `model_type` lookup, the CLI's help and the docs table
follow.
Every adapter is checked against the stock decoder layer when a model is loaded (check.py): a block it
misdescribes is refused in one line saying what differed.

A `model_type` with no adapter file is read from its module tree (structure.py): the Table 1 forms that fit
it are put on trial (STRUCTURAL), and the check on the loaded model keeps the first that holds, or refuses
the family in one line (docs/models.md says why that is safe)."""

from __future__ import annotations

from importlib import import_module

from experiments.core.errors import UserError
from experiments.patching.arch.base import BlockAdapter
from experiments.patching.families import FAMILY_TABLE, Family


def _collect(record: Family) -> BlockAdapter:
    """The adapter of arch/<record.module>.py. It takes its name, model types, theorem and tiny model from its
    record (`families.said_by`); whether it is post-norm its own fields decide, and a record that says otherwise
    is refused here, at import, before any help text or sweep repeats it."""
    adapter = import_module(f"{__name__}.{record.module}").ADAPTER
    if adapter.post_norm_block != record.post_norm:
        raise ImportError(f"patching/families.py: {record.module}'s record says post_norm={record.post_norm}, its "
                          f"adapter's rule and pre_norm_matrix say {adapter.post_norm_block}")
    return adapter


# each record's adapter file, in the table's order
FAMILIES: tuple[BlockAdapter, ...] = tuple(_collect(f) for f in FAMILY_TABLE)
ADAPTERS: dict[str, BlockAdapter] = {t: adapter for adapter in FAMILIES for t in adapter.model_types}
# model_type -> the forms its module tree allows (structure.py), most likely first, for a family without an
# adapter file; on trial until the loaded model's check picks one (then the list holds that one alone)
STRUCTURAL: dict[str, list[BlockAdapter]] = {}
# offline name -> adapter, for the families that carry a tiny random test model (all of them today)
TINY_MODELS: dict[str, BlockAdapter] = {a.tiny_model: a for a in FAMILIES if a.tiny_model and a.tiny_config}


def supported() -> str:
    return ", ".join(sorted(ADAPTERS))


def adapter_for(model_type: str) -> BlockAdapter:
    """The adapter for a transformers `model_type`, or one line naming the supported ones."""
    try:
        return ADAPTERS[model_type] if model_type in ADAPTERS else STRUCTURAL[model_type][0]
    except KeyError:
        raise UserError(f"model_type {model_type!r} has no context-patching adapter; "
                        f"supported: {supported()}") from None
