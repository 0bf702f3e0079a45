"""Xu & Fang's four experiments, their keys, types and defaults: composition rejects `dims=[a]` or
`seq_len=1.5`; the ranges stay in each experiment's validate(). What a preset changes is in
conf/preset_for/<name>/. Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import default, experiment_schemas, section


@dataclass
class AlignmentClaims:
    min_cosine: float = 0.95  # cos at t ≈ T must be at least this (the paper: → 1)
    gamma_tolerance: float = 0.05  # |γ̂ √d_k − 1| at t ≈ T
    min_control_gap: float = 0.1  # cos(readout) − cos(covariance-blind target) at t ≈ T
    slope_tolerance: float = 0.15  # |slope + 1| for the relative squared error vs t


@dataclass
class CovAlignment:
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
class CovIclGd:
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


@dataclass
class RateClaims:
    slope_tolerance: float = 0.1  # |slope + 1|
    constant_tolerance: float = 0.1  # |n·MSE / e^v(tr Σ + ‖m‖²) − 1| for i.i.d. inputs
    # |measured growth / predicted growth − 1| (the tilt's nonlinear part grows less than the linear
    # (1+ρ)/(1−ρ): 0.68 for ρ 0 → 0.5 at preset=cpu)
    growth_tolerance: float = 0.35


@dataclass
class CovRate:
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
class MarkovCollapse:
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


# Each experiment's schema, registered by config_schema.register_schemas (experiment_schema binds it to
# this module as <Name>Config).
# experiment name -> schema, each name from its class name (SystemCompile -> system_compile)
SCHEMAS = experiment_schemas(CovAlignment, CovIclGd, CovRate, MarkovCollapse)
