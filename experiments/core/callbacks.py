"""Hydra callbacks. After a multirun: a summary of its jobs, the combined figures, the exit status."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class CombineMultirun(Callback):
    """At the end of a sweep: one line per job that did not complete, the combined figures and
    claims of the jobs that did, and exit status 1 when any job failed (the jobs themselves return
    normally so that every job runs; see cli/hydra_app.py)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from experiments.core.distributed import is_main_process
        from experiments.core.errors import UserError
        from experiments.core.figures import completed_jobs, render_multirun
        from experiments.core.summary import sweep_summary

        if not is_main_process():  # under torchrun every rank runs the sweep; rank 0 alone combines and reports
            return
        sweep_dir = Path(config.hydra.sweep.dir).absolute()  # absolute, as the jobs' own lines are
        if not sweep_dir.is_dir():
            return
        lines: list[str] = []
        if completed_jobs(sweep_dir):
            figures_log = logging.getLogger("experiments.core.plotting")
            level = figures_log.level
            figures_log.setLevel(logging.WARNING)  # its "figure PATH" lines would come through Hydra's logger
            try:
                figures = [p for p in render_multirun(sweep_dir, warn=False) if p.suffix == ".png"]
                names = f" ({', '.join(p.name for p in figures)})" if figures else ""
                lines.append(f"combined figures{names} and claims of the complete jobs: {sweep_dir}")
            except UserError as err:
                lines.append(f"error: could not combine the jobs: {err}")
            finally:
                figures_log.setLevel(level)
        summary, n_bad = sweep_summary(sweep_dir)
        lines += summary
        # printed bare (Hydra's logger here would prefix a timestamp); to stderr when a job failed
        stream = sys.stderr if n_bad else sys.stdout
        for line in lines:
            print(line, file=stream, flush=True)
        if n_bad:
            raise SystemExit(1)  # not an Exception: Hydra's callback runner would turn that into a warning
