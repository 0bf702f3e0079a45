"""patch_match: Goldwaser et al. §4–5, Figs. 3–5 on any supported architecture, and Table 1 as a picture.
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
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    run=Later(f"{__name__}.run:run"),
    plot=Later(f"{__name__}.plots:plot"),
    validate=Later(f"{__name__}.run:validate"),
)
