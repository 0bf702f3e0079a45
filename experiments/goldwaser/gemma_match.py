"""gemma_match — Goldwaser et al. §4, Figs. 3–5, on Gemma 3 (the paper's model).

An instruction-tuned Gemma 3 (1B by default; 4B multimodal with an image for Fig. 5) gets the prompt
"Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."
and generates greedily; at every step the model without the context, patched by Algorithm 1 (or App.
B's stable update, or the closed loop), is compared with it. The same code as `patch_match`
(experiments/goldwaser/patch_match/), with Gemma 3's settings (conf/experiment/gemma_match.yaml).
"""

from __future__ import annotations

from experiments.core.registry import Experiment
from experiments.goldwaser.patch_match.plots import plot
from experiments.goldwaser.patch_match.run import run, validate

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="Figs. 3–5",
    description="Gemma 3 without context, patched per token (Thm 1, Alg. 1, App. B), vs with context",
    run=run,
    plot=plot,
    validate=validate,
    # the paper's Algorithm 1 and the conditioned open loop: on the trained 270M (preset=cpu) the first fails
    # and the second repairs it, and the report shows both
    reproduce_sweep=("variant=naive,conditioned",),
)
