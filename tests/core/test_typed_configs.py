"""Experiments read their typed config (registry.Experiment.config: the schema's dataclass instance), so a
value is already of its type and a missing key takes the schema's default: a cast of a config value
(`int(cfg.k)`) or a `.get` with a default (`cfg.get("k", 16)`) would say again what the schema says, and
may say it differently. Read from the source, every experiment module."""

from __future__ import annotations

import re

import pytest

from experiments.core.registry import REPO_ROOT

EXPERIMENTS = REPO_ROOT / "experiments"
CAST = re.compile(r"\b(?:int|float|str|bool)\(\s*cfg\b|\bcfg\.get\(")


def _sources() -> list:
    return sorted(EXPERIMENTS.rglob("*.py"))


def test_no_experiment_casts_its_config_or_repeats_a_default():
    found = [f"{p.relative_to(REPO_ROOT)}:{n}: {line.strip()}" for p in _sources()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if CAST.search(line)]
    assert not found, "read the typed config instead (the schema has the type and the default):\n" + "\n".join(found)


@pytest.mark.parametrize("line", ["k = int(cfg.k)", "x = float( cfg.train.lr)", "if cfg.get('image'):",
                                  "str(cfg.model).strip()", "bool(cfg.control)"])
def test_the_pattern_finds_a_cast(line):
    assert CAST.search(line)


@pytest.mark.parametrize("line", ["validate_checkpoint(cfg)", "blueprint(cfg.model)", "summary.get('x')"])
def test_the_pattern_leaves_other_calls(line):
    assert not CAST.search(line)


def test_an_experiment_gets_its_schema_object():
    """Enum keys as members, lists of names as lists of members, nodes as dataclasses; Hydra's own node
    (present where the CLI checks a job) left out."""
    import dataclasses

    from cli.compose import compose_config
    from experiments.core.registry import get
    from experiments.goldwaser.schema import LayerDtype, PatchVariant

    cfg = compose_config(["experiment=layer_errors", "preset=smoke", "variants=[naive]"])
    typed = get("layer_errors").config(cfg)
    assert dataclasses.is_dataclass(typed) and "hydra" in cfg
    assert typed.dtypes == [LayerDtype.float32, LayerDtype.float64] and typed.variants == [PatchVariant.naive]
    from experiments.goldwaser.system_compile.schema import Method

    compile_cfg = compose_config(["experiment=system_compile", "preset=smoke"])
    assert get("system_compile").config(compile_cfg).methods == [Method.analytic, Method.bake]
