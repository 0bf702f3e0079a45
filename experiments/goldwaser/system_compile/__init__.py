"""system_compile: a system prompt compiled into the weights, the analytic fixed patch against prompt baking
(a LoRA trained on the KL), measured on user queries neither was fitted on. See run.py.

The declaration of an experiment that outgrew a file (docs/design.md, "add an experiment"): the registry
reads EXPERIMENT here, run.py holds validate and run, claims.py and plots.py beside it. Nothing heavy is
imported here: the schema (schema.py) and `icl-exp list` import this package, so run, plot and validate
import run.py (pandas; torch inside it) only when called.
"""

from __future__ import annotations

from experiments.core.registry import Experiment, Later

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="(extension: system prompts)",
    description="a system prompt compiled into weights: analytic fixed patch vs prompt baking, on held-out queries",
    run=Later(f"{__name__}.run:run"),
    plot=Later(f"{__name__}.plots:plot_all"),
    validate=Later(f"{__name__}.run:validate"),
)
