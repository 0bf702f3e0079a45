"""context_compile: a prompt compiled once into fixed weights, and how far that carries (beyond the papers).
See run.py.

The declaration of an experiment that outgrew a file (docs/design.md, "add an experiment"): the registry
reads EXPERIMENT here; run.py holds validate and run, claims.py and plots.py sit beside it. Nothing heavy is
imported here, so that `icl-exp list` and the package's other modules cost no torch: run, plot and validate
import their modules only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiments.core.registry import Experiment

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd


# named with a leading underscore: a function `run` here would be replaced by the submodule run.py as the
# package's attribute once that is imported
def _run(cfg, ctx) -> None:
    from experiments.goldwaser.context_compile.run import run

    run(cfg, ctx)


def _plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    from experiments.goldwaser.context_compile.plots import plot_all

    return plot_all(metrics, figures_dir)


def _validate(cfg) -> None:
    from experiments.goldwaser.context_compile.run import validate

    validate(cfg)


EXPERIMENT = Experiment(
    name="context_compile",
    paper="Goldwaser et al.",
    figures="(extension §6)",
    description="one fixed weight change fitted at k positions stands in for a prompt: how far it carries",
    run=_run,
    plot=_plot,
    validate=_validate,
)
