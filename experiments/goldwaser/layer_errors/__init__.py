"""layer_errors: Goldwaser et al. Alg. 1 and the closed loop on trained weights, layer by layer: is it the
algorithm or the implementation? See run.py.

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
    from experiments.goldwaser.layer_errors.run import run

    run(cfg, ctx)


def _plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    from experiments.goldwaser.layer_errors.plots import plot

    return plot(metrics, figures_dir)


def _validate(cfg) -> None:
    from experiments.goldwaser.layer_errors.run import validate

    validate(cfg)


EXPERIMENT = Experiment(
    name="layer_errors",
    paper="Goldwaser et al.",
    figures="Alg. 1, App. B (per layer)",
    description="per-layer error, gain and one-ulp sensitivity of the open vs closed loop, float32 and float64",
    run=_run,
    plot=_plot,
    validate=_validate,
)
