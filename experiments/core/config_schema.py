"""The typed keys every experiment shares (seed, device, dtype, threads, preset), as a Hydra
structured config: an experiment's schema is `experiment_schema(its sections)`, Common's keys and its
own, so composing `dtype=float8` or `seed=abc` fails inside Hydra, and the CLI only has to word the
error (cli/config_errors.py).

Where a setting lives (docs/configuration.md): an experiment's keys, their types, their paper defaults
and the comment that says what each means are its dataclass in experiments/<paper>/schema.py, once. The
comments stand there and not in the yaml because a comment explains a value, and the value is written
where its type is; `icl-exp run NAME --cfg job` prints the values, the dataclass says what they mean.
conf/experiment/<name>.yaml registers the experiment and says what it reproduces (with sweep examples);
conf/preset_for/<name>/<preset>.yaml holds what a preset changes; the experiment's validate() only what a
type cannot say (ranges, keys against each other, the model, files). No value is written twice.

Kept free of torch: the schemas are registered before every composition, including the one that
answers a bad override in a second.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import sys
import typing
from dataclasses import dataclass
from enum import StrEnum

# The ConfigStore group the schemas live in, one option per experiment: conf/config.yaml selects
# `schema: ${experiment}` before the experiment's yaml, so the preset's values and the command line's merge
# onto its typed nodes. Not optional: the schema holds the values, so composing an experiment without one
# (or before register_schemas) fails instead of giving an empty config.
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
    """The keys every experiment reads. An experiment's schema may declare one again with its own default
    (experiment_schema)."""

    seed: int = 0
    # auto | cpu | cuda | cuda:N (auto takes a GPU when there is one; checked by cli/check_job.py: an Enum has
    # no cuda:N)
    device: str = "auto"
    dtype: Dtype = Dtype.float32  # float32 | bfloat16 | float16 | float64; aliases fp32, bf16, fp16, fp64
    threads: int | None = None  # intra-op CPU threads for torch (null: torch's default)


def default(value: list | dict) -> dataclasses.Field:
    """A list or dict default (a dataclass field takes no mutable default): each config gets a copy."""
    return dataclasses.field(default_factory=lambda: copy.deepcopy(value))


def section(cls: type, **values) -> dataclasses.Field:
    """A nested node of type `cls` (a dataclass) whose defaults are `cls`'s, but for `values`: how two
    experiments share a node's type and keep their own defaults (linreg_icl's and multilayer_ln's
    `train:` are both LinregTrain, with 4000 and 1000 steps)."""
    return dataclasses.field(default_factory=lambda: cls(**values))


_SCHEMAS: dict[type, type] = {}  # sections -> its schema: built once, so that each is one class (it pickles)


def experiment_schema(sections: type) -> type:
    """The schema of a whole experiment config: Common's keys, then the experiment's own (`sections`, a
    dataclass), then `preset`, in the order Hydra composes them (conf/config.yaml, the experiment's yaml,
    the preset file), so `--cfg job` prints the keys in the order it always did. Built, not inherited:
    a subclass of Common would put `preset` before the experiment's keys. A key of Common that `sections`
    declares again (linreg_icl's `threads: int | None = 1`) is the experiment's default for it, in
    Common's place."""
    if sections in _SCHEMAS:
        return _SCHEMAS[sections]

    def typed_fields(cls: type) -> list[tuple]:  # real types: the annotations are strings here
        hints = typing.get_type_hints(cls)
        return [(f.name, hints[f.name], f) for f in dataclasses.fields(cls)]

    own = {f[0]: f for f in typed_fields(sections)}
    common = []
    for key, kind, f in typed_fields(Common):
        if key in own and own[key][1] != kind:
            raise TypeError(f"{sections.__name__}.{key} is {own[key][1]}, but Common's {key} is {kind}")
        common.append(own.pop(key, (key, kind, f)))
    preset = ("preset", str, dataclasses.field(default="paper"))  # the preset group itself checks the name
    name = sections.__name__.removesuffix("Experiment") + "Config"
    schema = dataclasses.make_dataclass(name, [*common, *own.values(), preset])
    # bound to `name` in the module of `sections`, so a composed config pickles (the joblib and SLURM
    # launchers send it to their jobs, which import that module to read it back)
    schema.__module__ = sections.__module__
    setattr(sys.modules[sections.__module__], name, schema)
    _SCHEMAS[sections] = schema
    return schema


def experiment_name(sections: type) -> str:
    """The experiment a schema's sections class is for, from its class name, so that the name is written once
    (as conf/experiment/<name>.yaml and the module's file name): SystemCompile -> system_compile, CovIclGd ->
    cov_icl_gd, FactorizationExperiment -> factorization (the suffix where the plain name is taken)."""
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", sections.__name__.removesuffix("Experiment")).lower()


def experiment_schemas(*sections: type) -> dict[str, type]:
    """A paper's SCHEMAS (experiment name -> schema) from its experiments' sections classes."""
    return {experiment_name(cls): experiment_schema(cls) for cls in sections}


def register_schemas(*names: str) -> None:
    """Store the schemas of the experiments `names` (every experiment's when none is named) in Hydra's
    ConfigStore, each once, from their papers' schema.py (`SCHEMAS`, experiment name -> schema). Every
    composition calls this, and a command line composes one experiment: its answer imports that experiment's
    paper's schema.py alone (building a paper's schemas costs about 0.02 s) and stores that one schema
    (storing converts it to a config, 0.005 s), not all twenty."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    stored = set(store.list(GROUP)) if GROUP in store.repo else set()
    for package in _papers_of(names):
        name = f"experiments.{package}.schema"
        if importlib.util.find_spec(name) is not None:
            for experiment, schema in importlib.import_module(name).SCHEMAS.items():
                if (not names or experiment in names) and f"{experiment}.yaml" not in stored:
                    store.store(group=GROUP, name=experiment, node=schema, package="_global_")


def _papers_of(names: tuple[str, ...]) -> tuple[str, ...]:
    """The paper packages whose schema.py holds the schemas of `names`: each experiment's own paper; every
    paper when none is named, or for a name with no experiment module (check_schema_registered then says
    that it has no schema, as for any experiment without one)."""
    from experiments.core.papers import PAPER_PACKAGES, experiment_module

    modules = [experiment_module(name) for name in names]
    if not modules or None in modules:
        return PAPER_PACKAGES
    return tuple(dict.fromkeys(module.split(".")[1] for module in modules))


def typed(cfg):
    """A composed config as its schema's dataclass instance (OmegaConf.to_object): ints are ints, an Enum key
    holds its member, a list a list, a node its dataclass, and every default is the schema's, so code reads
    `cfg.k` and never casts or repeats a default. Hydra's own node (`hydra`, where the CLI composes with it
    to check a job) is no key of the schema and is left out; `cfg` itself is not changed. A config with no
    schema (a test's, made by hand for a stand-in experiment; every composed one has its schema) is returned
    as it is: attribute access reads it the same."""
    from omegaconf import OmegaConf, open_dict

    if not dataclasses.is_dataclass(OmegaConf.get_type(cfg)):
        return cfg
    if "hydra" in cfg:
        cfg = copy.copy(cfg)  # a shallow copy: the caller's config keeps its Hydra node
        with open_dict(cfg):
            cfg.pop("hydra")
    return OmegaConf.to_object(cfg)


def node_values(node, schema: type) -> dict:
    """A config node's values for the fields of `schema` (a dataclass), as keyword arguments: how a
    settings class built on its schema node (gpt/train.py's and dherin/training.py's TrainSettings) is
    made from the config, without copying it field by field. Keys the node lacks are left to the class.
    `node` is the typed config's dataclass instance, or a DictConfig node (as a test composes it)."""
    if dataclasses.is_dataclass(node):
        values = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    else:
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(node, resolve=True)
    return {f.name: values[f.name] for f in dataclasses.fields(schema) if f.name in values}
