"""gemma_match — Goldwaser et al. §4, Figs. 3–5, on Gemma 3 (the paper's model).

An instruction-tuned Gemma 3 (1B by default; 4B multimodal with an image for Fig. 5) gets the prompt
"Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."
and generates greedily; at every step the model without the context, patched by Algorithm 1 (or App.
B's stable update, or the closed loop), is compared with it. The same code as `patch_match`
(experiments/goldwaser/patch_match/), with Gemma 3's settings (GemmaMatchConfig, beside this file).
"""

from __future__ import annotations

# patch_match's run, validate and plot, where the registry looks for gemma_match's (its run.py)
from experiments.goldwaser.patch_match.plots import plot  # noqa: F401
from experiments.goldwaser.patch_match.run import run, validate  # noqa: F401
