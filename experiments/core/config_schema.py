"""The typed keys every experiment shares (seed, device, dtype, threads, preset), as a Hydra
structured config: an experiment's schema is `experiment_schema(its sections)`, Common's keys and its
own, so composing `dtype=float8` or `seed=abc` fails inside Hydra, and the CLI only has to word the
error (cli/config_errors.py).

Kept free of torch: the schemas are registered before every composition, including the one that
answers a bad override in a second.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import typing
from dataclasses import dataclass
from enum import StrEnum

# The ConfigStore group the schemas live in, one option per experiment that has one: conf/config.yaml
# selects `optional schema: ${experiment}` before the experiment's yaml, so its values (and the
# preset's, and the command line's) merge onto typed nodes. Experiments without a schema stay untyped.
GROUP = "schema"


class Dtype(StrEnum):
    """`dtype=`: the canonical names and their short aliases (an alias composes to its canonical
    member: `dtype=bf16` reads back as bfloat16). A StrEnum, so `cfg.dtype == "float32"` and
    f-strings still see the plain name."""

    float32 = "float32"
    fp32 = "float32"
    bfloat16 = "bfloat16"
    bf16 = "bfloat16"
    float16 = "float16"
    fp16 = "float16"
    float64 = "float64"
    fp64 = "float64"


# `device=` stays a string in the schema: besides these it takes cuda:N, which an Enum can't list.
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class Common:
    """Keys of conf/config.yaml that every experiment reads."""

    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N (checked by cli/overrides.py: an Enum has no cuda:N)
    dtype: Dtype = Dtype.float32
    threads: int | None = None  # intra-op CPU threads for torch (None: torch's default)


def experiment_schema(sections: type) -> type:
    """The schema of a whole experiment config: Common's keys, then the experiment's own (`sections`, a
    dataclass), then `preset`, in the order Hydra composes them (conf/config.yaml, the experiment's yaml,
    the preset file), so `--cfg job` prints the keys in the order it always did. Built, not inherited:
    a subclass of Common would put `preset` before the experiment's keys."""
    def typed_fields(cls: type) -> list[tuple]:  # real types: the annotations are strings here
        hints = typing.get_type_hints(cls)
        return [(f.name, hints[f.name], f) for f in dataclasses.fields(cls)]

    preset = ("preset", str, dataclasses.field(default="paper"))  # the preset group itself checks the name
    name = sections.__name__.removesuffix("Experiment") + "Config"
    schema = dataclasses.make_dataclass(name, [*typed_fields(Common), *typed_fields(sections), preset])
    schema.__module__ = sections.__module__  # the module binds it to `name`, so it pickles
    return schema


def register_schemas() -> None:
    """Store every paper's schemas (experiments/<paper>/schema.py, `register(store)`) in Hydra's
    ConfigStore. Idempotent: storing a name again replaces it."""
    from hydra.core.config_store import ConfigStore

    from experiments.core.registry import PAPER_PACKAGES

    store = ConfigStore.instance()
    for package in PAPER_PACKAGES:
        name = f"experiments.{package}.schema"
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(store)


def node_values(node, schema: type) -> dict:
    """A config node's values for the fields of `schema` (a dataclass), as keyword arguments: how a
    settings class built on its schema node (gpt/train.py's and dherin/training.py's TrainSettings) is
    made from the config, without copying it field by field. Keys the node lacks are left to the class."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(node, resolve=True)
    return {f.name: values[f.name] for f in dataclasses.fields(schema) if f.name in values}
