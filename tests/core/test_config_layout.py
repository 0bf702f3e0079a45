"""Where a setting lives (docs/configuration.md): an experiment's keys, types and defaults in its config class and
nowhere else; a preset changes only what it changes; both in the experiment's home
(experiments/<paper>/<name>/__init__.py), with no yaml file standing for either. Each rule fails on the
experiment that breaks it."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from experiments.core import registry
from experiments.core.registry import CONF_DIR, experiment_names
from tests.helpers.in_process import compose_config


def paper_config(name: str):
    return compose_config(name)


def leaves(node: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a preset's values."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name", experiment_names())
def test_every_key_has_a_default(name):
    assert OmegaConf.missing_keys(paper_config(name)) == set()


def test_no_yaml_stands_for_an_experiment():
    """The experiment and its presets are its home's (stored in the ConfigStore): a conf/experiment/ or
    conf/preset_for/ file would be a second place for them."""
    assert not (CONF_DIR / "experiment").exists() and not (CONF_DIR / "preset_for").exists()


def presets() -> list[tuple[str, str]]:
    """(experiment, preset) for each preset an experiment's PRESETS names."""
    return [(e.name, p) for e in registry.all_experiments() for p in e.presets]


@pytest.mark.parametrize("name, preset", presets(), ids=lambda x: x)
def test_a_preset_changes_only_what_it_changes(name, preset):
    """Every value a preset sets differs from the paper's: one equal to it is the default written twice. And
    the preset is one there is (conf/preset/): a misspelt one would never apply."""
    assert (CONF_DIR / "preset" / f"{preset}.yaml").is_file(), f"{name}: PRESETS names no preset {preset!r}"
    paper = OmegaConf.to_container(paper_config(name))
    restated = []
    for key, value in leaves(registry.get(name).presets[preset]):
        current = paper
        for part in key.split("."):
            current = current[part]
        if current == value:
            restated.append(f"{key}={value}")
    assert restated == [], f"{name}'s PRESETS[{preset!r}] restates the paper default: {', '.join(restated)}"


def test_an_experiments_name_is_written_once():
    """The name is the package's folder's: no declaration writes it again (the registry fills it in), each
    config class is its experiment's own (written in its package, named for it, a Common subclass), and a
    declaration that names itself is refused rather than trusted."""
    import importlib
    from dataclasses import replace

    from experiments.core.config_schema import Common

    for name in experiment_names():
        exp = registry.get(name)
        assert exp.name == name
        home = registry._module_name(name)
        camel = "".join(part.capitalize() for part in name.split("_")) + "Config"
        assert issubclass(exp.schema, Common) and exp.schema.__name__ == camel, name
        assert exp.schema.__module__ == home or exp.schema.__module__.startswith(home + "."), name
        assert [f.name for f in dataclasses.fields(exp.schema)][-1] == "preset", name

    module = importlib.import_module(registry._module_name("cov_rate"))
    original = module.EXPERIMENT
    try:
        module.EXPERIMENT = replace(original, name="cov_rates")
        with pytest.raises(RuntimeError, match="leave name= out"):
            registry.get("cov_rate")
    finally:
        module.EXPERIMENT = original
