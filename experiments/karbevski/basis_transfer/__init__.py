"""basis_transfer — Karbevski & Mijoski App. 8.3, Fig. 2 (MLP basis transfer approximation).

Karbevski & Mijoski App. 8.3, Fig. 2: a skip-GELU MLP learns a basis-changed skip MLP. The paper's
settings need a GPU (device=auto takes one); on a CPU the run warns with the expected time.
preset=cpu is the same protocol scaled to minutes.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, default, section
from experiments.core.registry import Experiment


@dataclass
class BasisTrain:
    steps: int = 20000
    batch: int = 65536
    lr: float = 5.0e-3  # AdamW, cosine decay to 0 over the steps
    weight_decay: float = 0.1
    clip: float = 3.0  # gradient norm
    log_every: int = 100


@dataclass
class Ridge:
    lam: float = 1.0e-6
    samples: int = 500000


@dataclass
class BasisClaims:
    max_spread: float = 1.5  # MLP error: largest over smallest across widths


@dataclass
class BasisTransferConfig(Common):
    """basis_transfer (App. 8.3, Fig. 2): the paper's settings."""

    widths: list[int] = default([256, 512, 768])  # h (the MLP hidden width is mult·h)
    mult: int = 4
    eval_samples: int = 65536  # held-out inputs for Fig. 2 (our choice; the paper does not say)
    chunk: int = 16384  # rows per chunk for the ridge stream and the evaluation (memory only)
    warn_after_s: int = 600  # on CPU, warn when the expected time is longer than this (seconds)
    train: BasisTrain = section(BasisTrain)
    ridge: Ridge = section(Ridge)
    claims: BasisClaims = section(BasisClaims)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: tiny widths and 200 steps (the MLP barely trains; its paper-value claims fail).
    "smoke": {
        "widths": [8, 16],
        "eval_samples": 2048,
        "chunk": 2048,
        "train": {
            "steps": 200,
            "batch": 512,
            "log_every": 10,
        },
        "ridge": {
            "samples": 8192,
        },
        "threads": 1,  # one thread: on a shared, busy 2-core machine two threads made small steps ~100x slower
    },
    # The same protocol scaled to minutes on a 2-core CPU: widths 32/64/96 (same 1:2:3 ratios), batch 4096,
    # 1500 steps, 200k ridge samples.
    "cpu": {
        "widths": [32, 64, 96],
        "eval_samples": 16384,
        "chunk": 8192,
        "train": {
            "steps": 1500,
            "batch": 4096,
            "log_every": 25,
        },
        "ridge": {
            "samples": 200000,
        },
        "threads": 1,  # one thread: on a shared, busy 2-core machine two threads made small steps ~100x slower
    },
}

EXPERIMENT = Experiment(
    paper="Karbevski & Mijoski",
    figures="App. 8.3 Fig. 2",
    description="a skip-GELU MLP learns a basis-changed skip MLP; optimal linear map as the baseline",
    schema=BasisTransferConfig,
    presets=PRESETS,
)
