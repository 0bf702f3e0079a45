"""Typed schemas of Xu & Fang's four experiments (conf/experiment/<name>.yaml keeps the values):
composition rejects `dims=[a]` or `seq_len=1.5`; the ranges stay in each experiment's validate().
Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from experiments.core.config_schema import GROUP, experiment_schema


@dataclass
class AlignmentClaims:
    min_cosine: float = MISSING
    gamma_tolerance: float = MISSING
    min_control_gap: float = MISSING
    slope_tolerance: float = MISSING


@dataclass
class CovAlignment:
    dims: list[int] = MISSING
    seq_len: int = MISSING
    draws: int = MISSING
    d_k: int | None = MISSING
    theta_std: float = MISSING
    positions_logged: int = MISSING
    late_window: int = MISSING
    fit_min_t: int = MISSING
    claims: AlignmentClaims = field(default_factory=AlignmentClaims)


@dataclass
class SingleLayer:
    tasks: int = MISSING
    max_demos: int = MISSING


@dataclass
class Stack:
    tasks: int = MISSING
    max_demos: int = MISSING
    layers: int = MISSING
    eta: float = MISSING


@dataclass
class IclGdClaims:
    min_cosine: float = MISSING
    max_rel_mse: float = MISSING
    few_hundred: int = MISSING
    few_hundred_min_cosine: float = MISSING
    fit_min_n: int = MISSING
    slope_tolerance: float = MISSING
    max_control_cosine: float = MISSING
    min_bayes_gap: float = MISSING


@dataclass
class CovIclGd:
    d_u: int = MISSING
    d_w: int = MISSING
    diag_low: float = MISSING
    diag_high: float = MISSING
    noise_std: float = MISSING
    grid_points: int = MISSING
    single: SingleLayer = field(default_factory=SingleLayer)
    stack: Stack = field(default_factory=Stack)
    claims: IclGdClaims = field(default_factory=IclGdClaims)


@dataclass
class RateClaims:
    slope_tolerance: float = MISSING
    constant_tolerance: float = MISSING
    growth_tolerance: float = MISSING


@dataclass
class CovRate:
    d: int = MISSING
    d_k: int | None = MISSING
    rhos: list[float] = MISSING
    trace_dims: list[int] = MISSING
    streams: int = MISSING
    stream_dims: int = MISSING
    max_n: int = MISSING
    tilt_variance: float = MISSING
    grid_points: int = MISSING
    fit_min_n: int = MISSING
    claims: RateClaims = field(default_factory=RateClaims)


@dataclass
class Estimate:
    streams: int = MISSING
    seq_len: int = MISSING
    burn_in: int = MISSING


@dataclass
class CollapseClaims:
    slope_tolerance: float = MISSING
    max_cov_error: float = MISSING
    min_control_ratio: float = MISSING


@dataclass
class MarkovCollapse:
    d: int = MISSING
    d_k: int | None = MISSING
    layers: int = MISSING
    head_scale: float = MISSING
    streams: int = MISSING
    seq_len: int = MISSING
    estimate: Estimate = field(default_factory=Estimate)
    bins_per_decade: int = MISSING
    fit_min_t: int = MISSING
    late_window: int = MISSING
    claims: CollapseClaims = field(default_factory=CollapseClaims)


# Module attributes, so a composed config pickles (the joblib launcher sends it to its workers).
CovAlignmentConfig = experiment_schema(CovAlignment)
CovIclGdConfig = experiment_schema(CovIclGd)
CovRateConfig = experiment_schema(CovRate)
MarkovCollapseConfig = experiment_schema(MarkovCollapse)

SCHEMAS = {"cov_alignment": CovAlignmentConfig, "cov_icl_gd": CovIclGdConfig, "cov_rate": CovRateConfig,
           "markov_collapse": MarkovCollapseConfig}


def register(store) -> None:
    for name, node in SCHEMAS.items():
        store.store(group=GROUP, name=name, node=node, package="_global_")
