"""gemma_match — Goldwaser et al. §4, Figs. 3–5, on Gemma 3 (the paper's model).

Goldwaser et al. §4 (Figs. 3–5): Gemma 3 without context, patched per token by Algorithm 1,
against Gemma 3 with the context. The paper's settings: patch_match's keys and values (prompts,
generation, checks) with Gemma 3 and the paper's open loop (GemmaMatch subclasses PatchMatch).
Fig. 5 puts an image in the context: image=PATH|synthetic (needs google/gemma-3-4b-it).

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.registry import Experiment
from experiments.goldwaser.patch_match import PatchMatchConfig
from experiments.goldwaser.schema import PatchVariant


@dataclass
class GemmaMatchConfig(PatchMatchConfig):
    """gemma_match (§4, Figs. 3–5): the paper's settings, patch_match's with Gemma 3 and the paper's open
    loop."""

    # hub id | local folder | PATH.gguf | offline: gemma-3-270m (real, trained), tiny-gemma3, gemma3-1b-random,
    # tiny-gemma3-vision
    model: str = "google/gemma-3-1b-it"
    # naive (Alg. 1, open loop) | stable (App. B: RMSNorm inversion, ΔW_down)
    # | conditioned (open loop, ΔW_down to C·sign(d_C): Eq. 4 divides by ±1)
    # | closed_loop, closed_loop_scale (constructions, exact by design)
    variant: PatchVariant = PatchVariant.naive


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # preset=smoke: seconds, for tests and CI.
    "smoke": {
        "model": "tiny-gemma3",
        "prompts": [
            "Hi.",
        ],
        "max_new_tokens": 6,
        "stop_at_eos": False,
    },
    # preset=cpu: minutes on 2 cores, offline, on trained weights: the real Gemma 3 270M (base, from the package
    # registry), the Fig. 3 prompt and two more, 24 tokens each: 72 generated tokens, each patched and checked
    # (about 1 s a token in float32 on 2 cores, with the control and the stock forward). Random weights hide what
    # trained ones show (the paper's Algorithm 1 fails here, conditioning repairs it); the tiny random Gemma 3 stays
    # for preset=smoke and the Table 1 sweep (model=tiny-gemma3).
    "cpu": {
        "model": "gemma-3-270m",
        "prompts": [
            "Explain in two sentences why the sky is blue.",
            "Give three tips for keeping a sourdough starter alive.",
        ],
        "max_new_tokens": 24,
    },
}

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="Figs. 3–5",
    description="Gemma 3 without context, patched per token (Thm 1, Alg. 1, App. B), vs with context",
    # the paper's Algorithm 1 and the conditioned open loop: on the trained 270M (preset=cpu) the first fails
    # and the second repairs it, and the report shows both
    reproduce_sweep=("variant=naive,conditioned",),
    schema=GemmaMatchConfig,
    presets=PRESETS,
)
