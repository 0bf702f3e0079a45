"""Run an experiment in this process on a composed config, so a test can hand it a broken input
(a monkeypatched function) and read the claims it then records; and see, without a subprocess, what
the command line says when it refuses a value."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig


def compose_config(name: str, *overrides: str) -> DictConfig:
    """The config `icl-exp run NAME OVERRIDES` composes (Hydra's compose API), nothing added: what
    `--cfg job` prints."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from experiments.core.config_store import register_schemas
    from experiments.core.registry import CONF_DIR

    register_schemas()  # the schemas hold the keys and their defaults
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", [f"experiment={name}", *overrides])


def compose(name: str, *overrides: str, preset: str = "smoke") -> DictConfig:
    """The config `icl-exp run NAME preset=PRESET OVERRIDES` composes, on the CPU (the tests' device)."""
    return compose_config(name, f"preset={preset}", "device=cpu", *overrides)


def run_claims(name: str, run_dir: Path, *overrides: str, preset: str = "smoke") -> pd.DataFrame:
    """The experiment run through the real runner (run.json, seeding, CSVs, figures); its claims by id."""
    from experiments.core.runner import run

    cfg = compose(name, *overrides, preset=preset)
    ctx = run(name, cfg, Path(run_dir), "in-process", list(overrides), preset=preset)
    return ctx.claims().set_index("id")


def refusal(name: str, run_dir: Path, *overrides: str) -> str:
    """The one-line error of `icl-exp run NAME preset=smoke OVERRIDES` for a value it refuses, whitespace
    folded; asserted on the way: exit status 2, an `error:` line, and no run folder left behind."""
    from tests.helpers.cli import invoke_in_process

    result = invoke_in_process("run", name, "preset=smoke", *overrides, f"hydra.run.dir={run_dir}")
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert text.startswith("error:"), result.stderr
    assert not run_dir.exists()
    return text
