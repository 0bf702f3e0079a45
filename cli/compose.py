"""Composing a command line's config as Hydra will, and reading its overrides: the config groups there are,
the values an override gives, every combination of a sweep. What the checks (check_*.py) and the CLI's
other commands compose with."""

from __future__ import annotations

import itertools

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

from experiments.core import registry
from experiments.core.config_store import GROUP, PRESET_GROUP, register_schemas

MAX_COMBINATIONS_CHECKED = 64


def compose_config(overrides: list[str]) -> DictConfig:
    """The config Hydra composes for these overrides (its own node included), the schema of their
    `experiment=NAME` registered first."""
    register_schemas(*(o.split("=", 1)[1] for o in overrides if o.startswith("experiment=")))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(registry.CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


# the groups whose options live in the ConfigStore, not in conf/ (config_store.register_schemas): the
# experiments' config classes and their presets
STORED_GROUPS = (GROUP, PRESET_GROUP)


def is_group(key: str) -> bool:
    return key.startswith("hydra/") or key in STORED_GROUPS or (registry.CONF_DIR / key).is_dir()


def group_options(group: str) -> list[str]:
    if group == GROUP:
        return registry.experiment_names()
    if group == PRESET_GROUP:  # NAME/PRESET, for each preset an experiment's PRESETS names
        return sorted(f"{e.name}/{p}" for e in registry.all_experiments() for p in e.presets)
    return sorted(p.stem for p in (registry.CONF_DIR / group).glob("*.yaml"))


def override_values(o: Override) -> list[str] | None:
    """The values an override gives its key (a sweep's every value), as strings; None for the sweeps Hydra
    alone expands (interval, glob), which the checks leave to it."""
    try:
        return [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [str(o.value())]
    except Exception:
        return None


def expand(parsed: list[Override]) -> list[list[str]]:
    """All combinations of a sweep's values (choice and range sweeps), as plain override lists."""
    options: list[list[str]] = []
    for o in parsed:
        if not o.is_sweep_override():
            options.append([o.input_line])
        elif values := override_values(o):  # interval / glob sweeps (None): left to Hydra
            options.append([f"{o.get_key_element()}={v}" for v in values])
    combos = itertools.islice(itertools.product(*options), MAX_COMBINATIONS_CHECKED)
    return [list(c) for c in combos]
