"""layer_errors: Goldwaser et al. Alg. 1 and the closed loop on trained weights, layer by layer: is it the
algorithm or the implementation? See run.py.

The declaration of an experiment that outgrew a file (docs/design.md, "add an experiment"): the registry
reads EXPERIMENT here; run.py holds validate and run, claims.py and plots.py sit beside it. Nothing heavy is
imported here, so that `icl-exp list` and the package's other modules cost no torch: run, plot and validate
import their modules only when called.
"""

from __future__ import annotations

from experiments.core.registry import Experiment, Later

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="Alg. 1, App. B (per layer)",
    description="per-layer error, gain and one-ulp sensitivity of the open vs closed loop, float32 and float64",
    run=Later(f"{__name__}.run:run"),
    plot=Later(f"{__name__}.plots:plot"),
    validate=Later(f"{__name__}.run:validate"),
)
