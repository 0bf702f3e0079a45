"""Where a setting lives (docs/configuration.md): an experiment's keys, types and defaults in its schema
dataclass and nowhere else; conf/experiment/<name>.yaml sets no value; a preset file changes only what
it changes. Each rule fails on the file that breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.core.registry import CONF_DIR, experiment_names
from tests.helpers.in_process import compose_config


def paper_config(name: str):
    return compose_config(name)


def leaves(node: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a loaded yaml file, its `defaults:` list left out."""
    for key, value in node.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name", experiment_names())
def test_experiment_yaml_sets_no_value(name):
    """The values are the schema's defaults: a key in the yaml would be a second place for it."""
    loaded = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")) or {}
    assert [key for key, _ in leaves(loaded)] == [], f"conf/experiment/{name}.yaml sets values: move them to its schema"


@pytest.mark.parametrize("name", experiment_names())
def test_every_key_has_a_default(name):
    assert OmegaConf.missing_keys(paper_config(name)) == set()


def preset_files() -> list[Path]:
    """conf/preset_for/<experiment>/<preset>.yaml (the `_`-named folders are pieces presets compose)."""
    return sorted(p for p in (CONF_DIR / "preset_for").glob("[!_]*/*.yaml"))


@pytest.mark.parametrize("path", preset_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_preset_changes_only_what_it_changes(path):
    """Every value a preset file sets differs from the paper's: one equal to it is the default written twice."""
    paper = OmegaConf.to_container(paper_config(path.parent.name))
    restated = []
    for key, value in leaves(OmegaConf.to_container(OmegaConf.load(path))):
        current = paper
        for part in key.split("."):
            current = current[part]
        if current == value:
            restated.append(f"{key}={value}")
    assert restated == [], f"{path.relative_to(CONF_DIR)} restates the paper default: {', '.join(restated)}"


def test_an_experiments_name_is_written_once():
    """The name is the files' (conf/experiment/<name>.yaml, the module or package): no declaration writes it
    again (the registry fills it in), the schemas are keyed by their class names and pair with the yamls
    exactly, and a declaration that names itself is refused rather than trusted."""
    import importlib.util
    import re
    from dataclasses import replace

    from experiments.core import registry
    from experiments.core.papers import PAPER_PACKAGES

    for name in experiment_names():
        source = Path(importlib.util.find_spec(registry._module_name(name)).origin).read_text()
        assert not re.search(r"EXPERIMENT = Experiment\([^)]*\bname=", source), f"{name} writes its name again"
        assert registry.get(name).name == name
    keyed = [key for package in PAPER_PACKAGES
             for key in importlib.import_module(f"experiments.{package}.schema").SCHEMAS]
    assert sorted(keyed) == experiment_names()

    module = importlib.import_module(registry._module_name("cov_rate"))
    original = module.EXPERIMENT
    try:
        module.EXPERIMENT = replace(original, name="cov_rates")
        with pytest.raises(RuntimeError, match="leave name= out"):
            registry.get("cov_rate")
    finally:
        module.EXPERIMENT = original
