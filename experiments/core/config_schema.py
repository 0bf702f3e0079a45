"""The typed keys every experiment shares (seed, device, dtype, threads, preset), as a Hydra
structured config: an experiment's config class is a dataclass subclass of `Common` written out in its own
home (`class CovRateConfig(Common):` in experiments/xu_fang/cov_rate/__init__.py), so composing
`dtype=float8` or `seed=abc` fails inside Hydra, and the CLI only has to word the error (cli/config_errors.py).

Where a setting lives (docs/configuration.md): an experiment's keys, their types, their paper defaults, the
comment that says what each means and what each preset changes (PRESETS) are in its home, once. The comments
stand there and not in a yaml because a comment explains a value, and the value is written where its type is;
`icl-exp run NAME --cfg job` prints the values, the class says what they mean. The experiment's validate()
holds only what a type cannot say (ranges, keys against each other, the model, files). No value is written
twice.

Kept free of torch: the config classes are stored before every composition (config_store.py), including
the one that answers a bad override in a second.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from enum import StrEnum


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

    @property
    def torch(self):
        """The torch dtype (torch.float32, ...): the canonical name is torch's. Torch is imported here, not with
        the schema (`icl-exp list` reads every config class without it)."""
        import torch

        return getattr(torch, self.value)


# A key with no default, which a `section(...)` must give: omegaconf's own MISSING marker ("???"), written here so
# that a config class costs no omegaconf import (`icl-exp list` imports every experiment's home).
MISSING = "???"

# `device=` stays a string in the schema: besides these it takes cuda:N, which an Enum can't list.
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class Common:
    """The keys every experiment reads; an experiment's config class subclasses it. A subclass may declare one
    of these again with its own default (multilayer_ln's `threads: int | None = 1`): the key keeps its place
    and takes the subclass's default."""

    seed: int = 0
    # auto | cpu | cuda | cuda:N (auto takes a GPU when there is one; checked by cli/check_job.py: an Enum has
    # no cuda:N)
    device: str = "auto"
    dtype: Dtype = Dtype.float32  # float32 | bfloat16 | float16 | float64; aliases fp32, bf16, fp16, fp64
    threads: int | None = None  # intra-op CPU threads for torch (null: torch's default)

    def __init_subclass__(cls, **kwargs):
        """Give each experiment's config class `preset` as its last key. Hydra composes the preset's group after
        the experiment's keys, and `--cfg job` has always printed `preset` last; declared here on Common it would
        come before the experiment's keys (a dataclass puts a base's fields first). The preset group itself
        checks the name, so a plain string. A class whose base already has it (gemma_match's on patch_match's)
        keeps the base's."""
        super().__init_subclass__(**kwargs)
        if not any("preset" in getattr(base, "__dataclass_fields__", {}) for base in cls.__mro__[1:]):
            cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}), "preset": "str"}
            cls.preset = "paper"


def default(value: list | dict) -> dataclasses.Field:
    """A list or dict default (a dataclass field takes no mutable default): each config gets a copy."""
    return dataclasses.field(default_factory=lambda: copy.deepcopy(value))


def section(cls: type, **values) -> dataclasses.Field:
    """A nested node of type `cls` (a dataclass) whose defaults are `cls`'s, but for `values`: how two
    experiments share a node's type and keep their own defaults (linreg_icl's and multilayer_ln's
    `train:` are both LinregTrain, with 4000 and 1000 steps)."""
    return dataclasses.field(default_factory=lambda: cls(**values))


def merged(*presets: dict) -> dict:
    """Presets' values merged, the later winning, nested nodes merged key by key: how a preset shares values
    with another (dherin's linreg training at preset=cpu, LINREG_TRAINING_CPU) and adds its own."""
    out: dict = {}
    for preset in presets:
        for key, value in preset.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merged(out[key], value) if both else copy.deepcopy(value)
    return out


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
