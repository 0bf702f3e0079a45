"""Hydra's own entry point. The CLI hands it argv untouched (plus `experiment=NAME` and the output
folder), so multirun, launchers, `hydra.run.dir=...`, `--cfg job` and logging behave exactly as
Hydra users expect."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from experiments.core.errors import UserError
from experiments.core.registry import CONF_DIR


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from experiments.core.runner import run_from_hydra

    try:
        run_from_hydra(cfg)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
