"""Hydra callbacks. After a multirun, draw the combined figures into the sweep folder."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class CombineMultirun(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from experiments.core.figures import job_dirs, render_multirun

        sweep_dir = Path(config.hydra.sweep.dir)
        if job_dirs(sweep_dir):
            render_multirun(sweep_dir)
            log.info("combined figures: %s", sweep_dir / "figures")
