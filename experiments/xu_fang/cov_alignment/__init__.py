"""cov_alignment — Xu & Fang Thm 3.4, App. B.1, Fig. 2.

Xu & Fang App. B.1, Fig. 2: for each d, a random Σ = BBᵀ, a Gaussian stream x_t = B z_t and a
frozen random single-head causal attention; cosine of y_t with Θ_V Σ Θ_Kᵀ Θ_Q x_t along t.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default, section
from experiments.core.registry import Experiment


@dataclass
class AlignmentClaims:
    min_cosine: float = 0.95  # cos at t ≈ T must be at least this (the paper: → 1)
    gamma_tolerance: float = 0.05  # |γ̂ √d_k − 1| at t ≈ T
    min_control_gap: float = 0.1  # cos(readout) − cos(covariance-blind target) at t ≈ T
    slope_tolerance: float = 0.15  # |slope + 1| for the relative squared error vs t


@dataclass
class CovAlignmentConfig(Common):
    """cov_alignment (App. B.1, Fig. 2)."""

    dims: list[int] = default([32, 64, 128, 256])  # paper: d ∈ {32, 64, 128, 256}, one panel each
    seq_len: int = 4096  # T, token positions (not given in the paper)
    draws: int = 8  # independent (Σ, Θ, stream) draws per d; the band is their spread (not given)
    d_k: int | None = None  # query/key width; null = d (not given)
    theta_std: float = 1.0  # Θ entries ~ N(0, theta_std²/d): fan-in init, logits of variance ≈ 1
    positions_logged: int = 96  # geometric grid of positions written to metrics.csv
    late_window: int = 64  # "value at the largest length" = mean over the last late_window positions
    fit_min_t: int = 64  # the 1/t fit of the relative squared error uses t ≥ fit_min_t
    claims: AlignmentClaims = section(AlignmentClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: two small d, a short context (cosines are lower; claims may fail).
    "smoke": {
        "dims": [8, 16],
        "seq_len": 512,
        "draws": 3,
        "positions_logged": 24,
        "late_window": 32,
        "fit_min_t": 16,
    },
    # The paper settings already take seconds on 2 cores; cpu only trims the draws.
    "cpu": {
        "draws": 6,
    },
}

EXPERIMENT = Experiment(
    paper="Xu & Fang",
    figures="Fig. 2",
    description="a frozen random softmax head's output aligns with Θ_V Σ Θ_Kᵀ Θ_Q x_t along the context (Thm 3.4)",
    schema=CovAlignmentConfig,
    presets=PRESETS,
)
