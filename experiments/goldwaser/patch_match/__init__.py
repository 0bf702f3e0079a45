"""patch_match: Goldwaser et al. §4–5, Figs. 3–5 on any supported architecture, and Table 1 as a picture.
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
    from experiments.goldwaser.patch_match.run import run

    run(cfg, ctx)


def _plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    from experiments.goldwaser.patch_match.plots import plot

    return plot(metrics, figures_dir)


def _validate(cfg) -> None:
    from experiments.goldwaser.patch_match.run import validate

    validate(cfg)


EXPERIMENT = Experiment(
    name="patch_match",
    paper="Goldwaser et al.",
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    run=_run,
    plot=_plot,
    validate=_validate,
)
