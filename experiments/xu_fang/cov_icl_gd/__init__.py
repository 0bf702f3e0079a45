"""cov_icl_gd — Xu & Fang §4 (Cor. 4.1, Prop. 4.4), App. B.2, Fig. 1 a–d.

Xu & Fang §4, App. B.2, Fig. 1 a–d: in-context linear regression read by frozen selector heads.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment


@dataclass
class SingleLayer:
    """Fig. 1 (a, b): Θ_Q = Θ_K = S_u, Θ_V = S_w, output × √d_u."""

    tasks: int = 512  # paper: 512 tasks per prompt length
    max_demos: int = 4096  # longest prompt (paper: "a few hundred"; the cumulative-sum pass makes more cheap)


@dataclass
class Stack:
    """Fig. 1 (c, d): residual stack of Eq. 3."""

    tasks: int = 256  # paper: 256 tasks
    max_demos: int = 1024  # longest prompt (causal attention among the demonstrations: cost ∝ max_demos²)
    layers: int = 8  # paper: K = 8
    eta: float = 0.01  # paper: η = 10⁻²


@dataclass
class IclGdClaims:
    min_cosine: float = 0.95  # cos at the longest prompt (paper: → 1)
    max_rel_mse: float = 0.05  # MSE / E‖target‖² at the longest prompt (paper: → 0)
    few_hundred: int = 300  # "essentially exact already at a few hundred demonstrations" ...
    few_hundred_min_cosine: float = 0.99  # ... read as cos ≥ this at `few_hundred` demonstrations
    fit_min_n: int = 32  # the 1/n fit of the MSE uses n ≥ fit_min_n
    slope_tolerance: float = 0.15  # |slope + 1|
    max_control_cosine: float = 0.1  # |cos| of the shuffled-label control at the longest prompt
    min_bayes_gap: float = 0.02  # cos with Σ_wu u_t exceeds cos with βᵀu_t by at least this


@dataclass
class CovIclGdConfig(Common):
    """cov_icl_gd (§4, App. B.2, Fig. 1 a–d)."""

    d_u: int = 16  # paper: d_u = 16
    d_w: int = 4  # paper: d_w = 4
    diag_low: float = 0.25  # Σ_uu diagonal entries ~ U[diag_low, diag_high] (paper: U[0.25, 1.0])
    diag_high: float = 1.0
    noise_std: float = 0.0  # paper: noise-free targets w_j = βᵀu_j
    grid_points: int = 64  # prompt lengths logged (geometric grid from 1 to max_demos)
    single: SingleLayer = section(SingleLayer)
    stack: Stack = section(Stack)
    claims: IclGdClaims = section(IclGdClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: fewer tasks, short prompts (cosines stay well below 1; claims may fail).
    "smoke": {
        "grid_points": 24,
        "single": {
            "tasks": 64,
            "max_demos": 256,
        },
        "stack": {
            "tasks": 32,
            "max_demos": 128,
        },
        "claims": {
            "few_hundred": 100,
            "fit_min_n": 16,
        },
    },
    # The paper settings take seconds on 2 cores; cpu shortens the single head's prompts.
    "cpu": {
        "single": {
            "max_demos": 2048,
        },
    },
}

EXPERIMENT = Experiment(
    paper="Xu & Fang",
    figures="Fig. 1 a-d",
    description="one selector head = one population GD step; an 8-block residual stack = 8 steps (Cor. 4.1, Prop. 4.4)",
    schema=CovIclGdConfig,
    presets=PRESETS,
)
