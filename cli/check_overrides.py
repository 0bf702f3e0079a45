"""The command line's overrides themselves, before any job's config: a schema for the experiment, no
argparse-style `--options`, a sweep only with -m, config group options that exist, no `+key` nobody reads."""

from __future__ import annotations

import difflib

from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from cli.compose import compose_config, group_options, is_group, override_values
from cli.config_errors import known_keys_hint, leaf_keys
from cli.hydra_flags import FLAGS as HYDRA_FLAGS
from experiments.core.config_store import GROUP, register_schemas
from experiments.core.errors import UserError


def check_schema_registered(name: str) -> None:
    """Every experiment has a config class in its home (experiments/<paper>/<name>/__init__.py): its keys, their
    types and defaults, stored as the option experiment=NAME. Without it there is no config to compose. A
    developer's error, said as one, before composing."""
    from hydra.core.config_store import ConfigStore

    register_schemas(name)
    store = ConfigStore.instance()
    if GROUP not in store.repo or f"{name}.yaml" not in store.list(GROUP):  # the group: none stored yet
        raise UserError(f"experiment {name} has no config: write its class (`class {_camel(name)}Config(Common):`, "
                        f"its keys, types and defaults) in experiments/<paper>/{name}/__init__.py and declare "
                        f"EXPERIMENT = Experiment(..., schema={_camel(name)}Config) there, as every other "
                        f"experiment does")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def check_flags(name: str, overrides: list[str]) -> None:
    """`--preset cpu` (or `--seed=1`): argparse-style options are not Hydra overrides, and Hydra's answer
    is its eight-line usage. Say the override it meant, or that the option is unknown."""
    for i, arg in enumerate(overrides):
        if not arg.startswith("-") or arg.split("=", 1)[0] in HYDRA_FLAGS:
            continue
        key, _, value = arg.lstrip("-").partition("=")
        typed = arg
        if not value and i + 1 < len(overrides) and not overrides[i + 1].startswith("-") \
                and "=" not in overrides[i + 1]:
            value = overrides[i + 1]
            typed = f"{arg} {value}"
        try:
            keys = leaf_keys(compose_config([f"experiment={name}"]))
        except HydraException:
            keys = []
        candidates = (key, key.replace("-", "_"), key.replace("-", "."))
        known = next((k for k in candidates if k in keys or (is_group(k) and not k.startswith("hydra"))), None)
        if known:
            raise UserError(f"{typed}: overrides take no dashes: use {known}={value or 'VALUE'} "
                            f"(icl-exp run {name} {known}={value or 'VALUE'})")
        raise UserError(f"unknown option {arg}; settings are key=value overrides (see `icl-exp run {name} --cfg "
                        f"job`), and the options are -m and Hydra's: --cfg job, --info, --resolve, --package")


def check_sweeps_and_groups(name: str, parsed: list[Override], multirun: bool) -> None:
    """A comma-separated value without -m (Hydra's answer is a five-line ambiguity message), and a
    config group option that does not exist (`preset=gpu`), named with the options there are."""
    for o in parsed:
        key = o.key_or_group
        if o.is_sweep_override() and not multirun:
            raise UserError(f"{o.input_line} gives several values: use -m to sweep "
                            f"(icl-exp run {name} -m {o.input_line}), or quote a single value")
        if is_group(key) and not key.startswith("hydra") and not o.is_delete():
            options = group_options(key)
            for value in override_values(o) or []:
                if value not in options:
                    close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
                    mean = f"; did you mean {key}={close[0]}?" if close else ""
                    raise UserError(f"{key}={value} is not a {key}: choose one of {', '.join(options)}{mean}")


def check_added_keys(parsed: list[Override], ref: DictConfig) -> None:
    """`+key` (or `++key`) for a key no experiment reads: Hydra adds it, nobody reads it, the run
    silently uses the default. Group additions (`+group=option`) and Hydra's own keys pass."""
    for o in parsed:
        key = o.key_or_group
        if is_group(key) or key.startswith("hydra"):
            continue
        if o.is_add() or o.is_force_add():
            if OmegaConf.select(ref, key, default="__missing__") == "__missing__":
                raise UserError(f"{o.input_line}: no experiment reads {key!r}, so it would be ignored "
                                f"({known_keys_hint(key, ref)})")
