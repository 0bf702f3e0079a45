"""cov_rate — Xu & Fang Thm 3.6 (a rate the paper proves but does not plot).

Xu & Fang Thm 3.6: E‖X̄_n(q) − m_x(q)‖² ≤ C₁ τ_α tr Σ / n (not plotted in the paper).

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default, section
from experiments.core.registry import Experiment


@dataclass
class RateClaims:
    slope_tolerance: float = 0.1  # |slope + 1|
    constant_tolerance: float = 0.1  # |n·MSE / e^v(tr Σ + ‖m‖²) − 1| for i.i.d. inputs
    # |measured growth / predicted growth − 1| (the tilt's nonlinear part grows less than the linear
    # (1+ρ)/(1−ρ): 0.68 for ρ 0 → 0.5 at preset=cpu)
    growth_tolerance: float = 0.35


@dataclass
class CovRateConfig(Common):
    """cov_rate (Thm 3.6). Not plotted in the paper; every value here is our choice."""

    d: int = 16  # input dimension of the correlation scan
    d_k: int | None = None  # key width; null = d
    rhos: list[float] = default([0.0, 0.5, 0.8, 0.9])  # AR(1) correlations (0 = i.i.d.)
    trace_dims: list[int] = default([4, 16, 64])  # dimensions of the i.i.d. trace scan (tr Σ ≈ d)
    streams: int = 256  # independent streams (each with its own query) for the correlation scan
    stream_dims: int = 4096  # trace scan: streams × d held constant (the error sums over d coordinates)
    max_n: int = 4096  # longest context
    tilt_variance: float = 1.0  # qᵀΘ_KΣΘ_Kᵀq / d_k for every query: the boundary of Thm 3.6's cone
    grid_points: int = 64  # n values written to metrics.csv
    fit_min_n: int = 256  # the slope is fitted on n ≥ fit_min_n (past the AR(1) correlation time)
    claims: RateClaims = section(RateClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: short contexts, few streams (slopes are rough; claims may fail).
    "smoke": {
        "rhos": [0.0, 0.5],
        "trace_dims": [4, 16],
        "streams": 64,
        "stream_dims": 512,
        "max_n": 512,
        "grid_points": 24,
        "fit_min_n": 64,
    },
    # The paper settings take seconds on 2 cores; cpu halves the streams.
    "cpu": {
        "streams": 128,
        "stream_dims": 2048,
    },
}

EXPERIMENT = Experiment(
    paper="Xu & Fang",
    figures="Thm 3.6 (no figure in the paper)",
    description="E‖X̄_n(q) − m_x(q)‖² ∝ τ_α tr Σ / n for i.i.d. and AR(1) streams",
    schema=CovRateConfig,
    presets=PRESETS,
)
