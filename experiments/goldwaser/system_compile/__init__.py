"""system_compile: a system prompt compiled into the weights, the analytic fixed patch against prompt baking
(a LoRA trained on the KL), measured on user queries neither was fitted on. See run.py.

The declaration of an experiment that outgrew a file (docs/design.md, "add an experiment"): the registry
reads EXPERIMENT here, run.py holds validate and run, claims.py and plots.py beside it. Nothing heavy is
imported here: the schema (schema.py) and `icl-exp list` import this package, so run, plot and validate
import run.py (pandas; torch inside it) only when called.
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
    from experiments.goldwaser.system_compile.run import run

    run(cfg, ctx)


def _plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    from experiments.goldwaser.system_compile.plots import plot_all

    return plot_all(metrics, figures_dir)


def _validate(cfg) -> None:
    from experiments.goldwaser.system_compile.run import validate

    validate(cfg)


EXPERIMENT = Experiment(
    name="system_compile",
    paper="Goldwaser et al.",
    figures="(extension: system prompts)",
    description="a system prompt compiled into weights: analytic fixed patch vs prompt baking, on held-out queries",
    run=_run,
    plot=_plot,
    validate=_validate,
)
