"""Hydra instantiates sweepers only from the `hydra_plugins` namespace package: the project's resuming
sweeper (experiments/core/resume.py, used by `icl-exp resume`) is registered here, with its config node
`hydra/sweeper=icl_exp_resume`."""

from experiments.core.resume import ResumeSweeper as _ResumeSweeper
from experiments.core.resume import register_config

register_config()


class ResumeSweeper(_ResumeSweeper):
    """Hydra's basic sweeper running only a sweep's jobs that did not complete (experiments/core/resume.py)."""
