"""wq_reparam — Karbevski & Mijoski §3-4 and App. 8.2-8.5: every W_Q = I construction, checked.

Karbevski & Mijoski §3-4, App. 8.2-8.5: the W_Q = I constructions in float64 on random weights.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default, section
from experiments.core.registry import Experiment


@dataclass
class ReluCheck:
    """App. 8.4 (Thm 8.3, Lemma 8.4, Cor. 8.4.1)."""

    h: int = 3  # input width (h ≥ 2)
    m: int = 8  # hidden width (the no-fit search tries all 2^m sign patterns)
    j_size: int = 4  # |J| of the constructed absorbable pair (h ≤ |J| ≤ m)
    samples: int = 2000


@dataclass
class Remark5:
    """Deviation of f_M = L⁻¹∘M₀∘L from linearity across d."""

    dims: list[int] = default([8, 16, 32, 64, 128, 256, 512, 1024])
    samples_per_dim: int = 4  # least-squares fit on 4d inputs, deviation measured on 4d fresh ones
    scale: float = 1.0  # inputs x ~ N(0, scale² I)
    eps: float = 1.0e-5


@dataclass
class NanoGptShape:
    """The shape whose parameter count Table 2 reports."""

    d_model: int = 768
    layers: int = 12
    vocab: int = 50304
    block_size: int = 1024


@dataclass
class ReparamClaims:
    exact_tolerance: float = 1.0e-10  # relative max error of an exact statement in float64
    control_min: float = 1.0e-3  # a control (or an obstruction) must differ at least this much
    remark5_slope_max: float = -0.25  # log-log slope of the deviation against d must be at most this


@dataclass
class WqReparamConfig(Common):
    """wq_reparam (§3-4, App. 8.2-8.5). The theorems hold for any sizes; the paper fixes none, so these are
    our choice (small enough to run in float64 on a laptop, large enough to be a real multi-head, multi-layer
    model)."""

    d_model: int = 64
    heads: int = 8
    layers: int = 4
    d_ff: int = 256  # MLP hidden width (4 d_model)
    vocab: int = 128
    seq_len: int = 32
    batch: int = 4
    ln_eps: float = 1.0e-5  # LayerNorm ε (App. 8.2)
    trials: int = 5  # independent random draws per statement; the worst one is reported
    wq_rank: int | None = None  # rank of every W_Q; null = full. Below d_model W_Q is singular and the run refuses.
    relu: ReluCheck = section(ReluCheck)
    remark5: Remark5 = section(Remark5)
    nanogpt: NanoGptShape = section(NanoGptShape)
    claims: ReparamClaims = section(ReparamClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a small model, two draws, a short Remark 5 sweep (every claim still holds).
    "smoke": {
        "d_model": 16,
        "heads": 4,
        "layers": 2,
        "d_ff": 32,
        "vocab": 32,
        "seq_len": 8,
        "batch": 2,
        "trials": 2,
        "relu": {
            "m": 6,
            "samples": 500,
        },
        "remark5": {
            "dims": [8, 16, 32, 64],
        },
        "threads": 1,  # one thread: on a shared, busy 2-core machine two threads made small steps ~100x slower
    },
    # The paper settings take about a minute on 2 cores; cpu uses 3 draws and stops Remark 5 at d = 512.
    "cpu": {
        "trials": 3,
        "remark5": {
            "dims": [8, 16, 32, 64, 128, 256, 512],
        },
    },
}

EXPERIMENT = Experiment(
    paper="Karbevski & Mijoski",
    figures="§3-4, App. 8.2-8.5 (theorems)",
    description="every W_Q = I construction in float64 beside a failing control; the obstructions measured",
    computes_in=("cpu", "float64"),  # random float64 weights built on the CPU, whatever device= and dtype= say
    schema=WqReparamConfig,
    presets=PRESETS,
)
