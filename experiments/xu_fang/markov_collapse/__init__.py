"""markov_collapse — Xu & Fang Thm 5.2 (a rate the paper proves but does not plot).

Xu & Fang Thm 5.2: an L-layer single-head stack on a stationary Gaussian stream; the terminal
hidden state approaches the context-free map F^(L)(x_t) of Eq. 6 at rate 1/t. Not plotted in the
paper.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment


@dataclass
class Estimate:
    """The long independent run that estimates Σ_0..Σ_{L-1}."""

    streams: int = 16
    seq_len: int = 4096
    burn_in: int = 2048  # positions ≥ burn_in of every stream are pooled


@dataclass
class CollapseClaims:
    slope_tolerance: float = 0.1  # |slope + 1|
    max_cov_error: float = 0.05  # relative Frobenius error of Σ̂_ℓ against the closed form
    min_control_ratio: float = 5.0  # covariance-blind error / readout error at late t (the readout is ≥ 5× closer)


@dataclass
class MarkovCollapseConfig(Common):
    """markov_collapse (Thm 5.2). Not plotted in the paper; every value here is our choice."""

    d: int = 16  # width of the stream and of the hidden states
    d_k: int | None = None  # key width; null = d
    layers: int = 3  # L
    head_scale: float = 0.7  # Θ entries ~ N(0, head_scale²/d): most queries in Thm 5.2's cone (logit variance ≤ 1)
    streams: int = 128  # independent test streams (the expectation)
    seq_len: int = 2048  # positions per test stream
    estimate: Estimate = section(Estimate)
    bins_per_decade: int = 12  # per-position errors are averaged on geometric bins of t
    fit_min_t: int = 16  # the slope is fitted on t ≥ fit_min_t
    late_window: int = 256  # "late t" = the last late_window positions
    claims: CollapseClaims = section(CollapseClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: short streams, a short estimation run (claims may fail).
    "smoke": {
        "d": 8,
        "layers": 2,
        "streams": 32,
        "seq_len": 256,
        "estimate": {
            "streams": 8,
            "seq_len": 512,
            "burn_in": 256,
        },
        "fit_min_t": 8,
        "late_window": 32,
    },
    # The paper settings take seconds on 2 cores; cpu halves the test streams.
    "cpu": {
        "streams": 64,
    },
}

EXPERIMENT = Experiment(
    paper="Xu & Fang",
    figures="Thm 5.2 (no figure in the paper)",
    description="an L-layer attention stack forgets its context: E‖h_t^(L) − F^(L)(x_t)‖² ∝ 1/t",
    schema=MarkovCollapseConfig,
    presets=PRESETS,
)
