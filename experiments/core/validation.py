"""Config checks shared by the experiments' `validate()` functions."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from experiments.core.errors import UserError


def require_positive(cfg: DictConfig, *keys: str) -> None:
    """Each dotted key (e.g. "train.steps") must hold an integer of at least 1."""
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if int(value) < 1:
            raise UserError(f"{key}={value} must be at least 1")
