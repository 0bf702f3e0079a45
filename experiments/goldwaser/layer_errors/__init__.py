"""layer_errors: Goldwaser et al. Alg. 1 and the closed loop on trained weights, layer by layer: is it the

Goldwaser et al. Alg. 1 (open loop) and the closed loop on trained weights, layer by layer: per-layer
hidden error, the patched layer's gain against the original's, max |Δm|, and the patched model's
one-ulp sensitivity, in float32 and in float64 (float64 end to end) within one run.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py, claims.py and plots.py (run, validate and plot, found by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default
from experiments.core.registry import Experiment
from experiments.goldwaser.schema import MARS_PROMPT, LayerDtype, PatchApply, PatchVariant


@dataclass
class LayerErrorsConfig(Common):
    """layer_errors (Alg. 1 open loop and the closed loop, layer by layer)."""

    # the real, trained Gemma 3 270M (offline); qwen2.5-0.5b | tiny-gemma3 | a local folder | a hub id
    model: str = "gemma-3-270m"
    # this experiment's own dtypes, float32 | float64 (the model is loaded once in each; dtype= is not used)
    dtypes: list[LayerDtype] = default([LayerDtype.float32, LayerDtype.float64])
    # naive | stable | conditioned | closed_loop_scale | closed_loop; null: naive, closed_loop_scale where the block
    # has a post-MLP norm, closed_loop (with apply=action: the open loop alone)
    variants: list[PatchVariant] | None = None
    # the open loop's matrices: materialized (W + ΔW rounded) | action (W·z + c (vᵀz) in the dtype; see PatchMatch)
    apply: PatchApply = PatchApply.materialized
    prompts: list[str] = default([
        "List three reasons why octopuses are considered intelligent animals.",
        MARS_PROMPT,
        "Explain in two sentences why the sky is blue.",
        "Give three tips for keeping a sourdough starter alive.",
    ])
    chat_template: bool = True  # wrap each prompt in the model's chat template when it has one
    max_new_tokens: int = 16  # tokens per prompt (greedy, with the context); each is patched and measured
    # |δ| / |x| of the random input change that measures a layer's gain: well above float32 rounding (6e-8) of
    # the layer's output in float32
    delta_rel: dict[str, float] = default({"float32": 1.0e-3, "float64": 1.0e-6})


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # preset=smoke: seconds, for tests and CI: the tiny random Gemma 3 (4 layers), 1 prompt x 2 tokens.
    "smoke": {
        "model": "tiny-gemma3",
        "prompts": [
            "Hi.",
        ],
        "max_new_tokens": 2,
    },
    # preset=cpu: minutes on 2 cores, offline: the real Gemma 3 270M (the paper preset's model), one prompt x 6
    # tokens, float32 and float64 x 3 variants (each token: the patched pass, every layer's gain both ways, the
    # one-ulp sensitivity, the control and the closed loops' open-loop counterparts: 2 prompts x 8 tokens took
    # 11 min in reproduce on a shared 2-core machine).
    "cpu": {
        "prompts": [
            "List three reasons why octopuses are considered intelligent animals.",
        ],
        "max_new_tokens": 6,
    },
}

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="Alg. 1, App. B (per layer)",
    description="per-layer error, gain and one-ulp sensitivity of the open vs closed loop, float32 and float64",
    schema=LayerErrorsConfig,
    presets=PRESETS,
)
