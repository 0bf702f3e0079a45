"""rnn_context — Dherin et al. App. D.1, Fig. 6.

Dherin et al. App. D.1, Fig. 6: an RNN as the contextual layer. The context still moves exactly
into the rank-1 ΔW, but the increments ‖(ΔW)_(i+1) − (ΔW)_i‖₂ do not converge as the context
grows, unlike the attention model's (Fig. 3).

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment
from experiments.dherin.schema import SMALL_OPS_THREADS, Dynamics, LinregModel, LinregTask, LinregTrain


class Nonlinearity(StrEnum):
    """torch.nn.RNN's `nonlinearity=` choices."""

    tanh = "tanh"
    relu = "relu"


@dataclass
class RnnModel:
    d_model: int = 64  # paper: RNN feature dimension 64 (torch.nn.RNN; linear read-out to d+1)
    d_mlp: int = 128  # paper: d_mlp = 128
    nonlinearity: Nonlinearity = Nonlinearity.relu  # not given in the paper; tanh did not learn the task here


@dataclass
class AttentionTrain:
    """A short schedule: the single-layer model learns the task in a few hundred steps."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1.0e-3
    grad_clip: float | None = 1.0


@dataclass
class AttentionBaseline:
    """rnn_context's comparison curve of Fig. 6 right: §4's single-layer attention model (Fig. 3),
    linreg_icl's block, trained in the run or loaded."""

    checkpoint: str | None = None  # a linreg_icl run folder or its model.pt; null = train one here on this run's task
    model: LinregModel = section(LinregModel)
    train: AttentionTrain = section(AttentionTrain)


@dataclass
class RnnEval:
    n_val_tasks: int = 500  # fixed held-out validation set (its own seed, the same across runs)
    val_seed: int = 12345
    chunk: int = 500  # prompts per forward pass (memory knob)


@dataclass
class RnnDynamics(Dynamics):
    """Fig. 6 right: mean ± s.e. over 100 trials (paper: 100), on dw_convergence's tasks (its seed)."""

    decay_bar: float = 0.1  # converges = that ratio ≤ 0.1 (dw_convergence's criterion for Fig. 3)


@dataclass
class RnnContextConfig(Common):
    """rnn_context (App. D.1, Fig. 6): an RNN as the contextual layer."""

    threads: int | None = SMALL_OPS_THREADS
    task: LinregTask = section(LinregTask, n_examples=200)  # paper: N = 200
    model: RnnModel = section(RnnModel)
    # paper: 10,000 steps, batch 32, lr 0.005 (AdamW, no weight decay; the gradient clip is ours), validation
    # every 100 steps
    train: LinregTrain = section(LinregTrain, steps=10000, batch_size=32, lr=5.0e-3, eval_every=100)
    attention: AttentionBaseline = section(AttentionBaseline)
    eval: RnnEval = section(RnnEval)
    dynamics: RnnDynamics = section(RnnDynamics)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a short context and a few steps (the models do not learn the task;
    # the learning claims are then reported as failed, the equivalence claims still hold).
    "smoke": {
        "task": {
            "n_examples": 20,
        },
        "train": {
            "steps": 30,
            "eval_every": 10,
        },
        "eval": {
            "n_val_tasks": 64,
        },
        "attention": {
            "train": {
                "steps": 20,
            },
        },
        "dynamics": {
            "n_tasks": 8,
        },
    },
    # Minutes on a 2-core laptop: a shorter schedule and context.
    "cpu": {
        "task": {
            "n_examples": 100,
        },
        "train": {
            "steps": 2000,
        },
        "eval": {
            "n_val_tasks": 200,
        },
        "attention": {
            "train": {
                "steps": 500,
            },
        },
    },
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="Fig. 6",
    description="RNN as the contextual layer: the ΔW patch is still exact, but its increments do not converge",
    schema=RnnContextConfig,
    presets=PRESETS,
)
