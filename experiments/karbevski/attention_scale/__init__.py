"""attention_scale — Karbevski & Mijoski App. 8.1 (the 1/(2√d_k) attention scale of Table 2).

Karbevski & Mijoski App. 8.1: std of raw attention scores q·k at initialization, baseline vs W_Q = I.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default, section
from experiments.core.registry import Experiment


@dataclass
class ScaleSweep:
    d_k: int = 64  # the d_model sweep keeps d_k = 64 (heads = d_model/64)
    d_models: list[int] = default([64, 128, 256, 512, 768, 1024, 2048])
    heads: list[int] = default([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])  # at d_model above


@dataclass
class ScaleClaims:
    std_rel_tolerance: float = 0.03  # |measured − paper| ≤ 3% of the paper's std
    ratio_tolerance: float = 0.05  # |ratio − 1.8|
    ratio_rel_tolerance: float = 0.05  # sweep: |ratio·σ√d − 1|


@dataclass
class AttentionScaleConfig(Common):
    """attention_scale (App. 8.1). The paper's shape is nanoGPT's GPT-2 small; the sample sizes and the
    sweeps are our choice."""

    sigma: float = 0.02  # init std of W_Q, W_K (nanoGPT)
    d_model: int = 768
    heads: int = 12  # d_k = 64
    seq_len: int = 64  # tokens per sequence (every token pair's score is a sample)
    sequences: int = 32  # sequences per weight draw
    weight_draws: int = 8  # independent (W_Q, W_K) draws; error bars are s.e.m. over draws
    embedding_std: float = 0.02  # LayerNorm inputs: token + position embeddings at nanoGPT's init
    ln_eps: float = 1.0e-5  # torch's LayerNorm default, as in nanoGPT
    sweep: ScaleSweep = section(ScaleSweep)
    claims: ScaleClaims = section(ScaleClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: fewer samples and a short sweep (the claims still hold at this size).
    "smoke": {
        "seq_len": 32,
        "sequences": 8,
        "weight_draws": 3,
        "sweep": {
            "d_models": [64, 256, 768],
            "heads": [1, 12, 32],
        },
        "threads": 1,  # one thread: on a shared, busy 2-core machine two threads made small steps ~100x slower
    },
    # The paper settings take about a minute on 2 cores; cpu drops d_model 2048 and halves the draws.
    "cpu": {
        "weight_draws": 4,
        "sweep": {
            "d_models": [64, 128, 256, 512, 768, 1024],
        },
    },
}

EXPERIMENT = Experiment(
    paper="Karbevski & Mijoski",
    figures="App. 8.1",
    description="std of attention scores at init, baseline vs W_Q = I: the 1.8 ratio and the 1/2 scale",
    schema=AttentionScaleConfig,
    presets=PRESETS,
)
