"""context_compile: a prompt compiled once into fixed weights, and how far that carries (beyond the papers).
See run.py.

The declaration of an experiment that outgrew a file (docs/design.md, "add an experiment"): the registry
reads EXPERIMENT here; run.py holds validate and run, claims.py and plots.py sit beside it. Nothing heavy is
imported here, so that `icl-exp list` and the package's other modules cost no torch: run, plot and validate
import their modules only when called.
"""

from __future__ import annotations

from experiments.core.registry import Experiment, Later

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="(extension §6)",
    description="one fixed weight change fitted at k positions stands in for a prompt: how far it carries",
    run=Later(f"{__name__}.run:run"),
    plot=Later(f"{__name__}.plots:plot_all"),
    validate=Later(f"{__name__}.run:validate"),
)
