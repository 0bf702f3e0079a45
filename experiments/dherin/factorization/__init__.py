"""factorization — Dherin et al. App. E (Remark 3.2, Corollary E.0.1, Eqs. 27–31).

Dherin et al. App. E (Eqs. 27–31): consume the context one token at a time from the front,
updating W so the block's output is unchanged at every step; W_n is a product of factors.
The model is linreg_icl's (its schema subclasses PretrainedLinreg), trained in the run or checkpoint=PATH.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment
from experiments.dherin.schema import LINREG_TRAINING_CPU, PretrainedLinreg


@dataclass
class Factorization:
    n_tasks: int = 100  # prompts checked (the paper gives no number; 100 as in Figs 3–5)
    data_seed: int = 7077  # the prompts' own seed
    float64: bool = True  # also check in float64 (a float64 copy of the same trained weights)


@dataclass
class FactorizationConfig(PretrainedLinreg, Common):
    """factorization (App. E)."""

    factorization: Factorization = section(Factorization)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a short context, a few training steps, few tasks (the model does not
    # learn the task; that claim then fails, the exactness claims still hold).
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
        "factorization": {
            "n_tasks": 12,
        },
    },
    # Minutes on a 2-core laptop: linreg_icl's shorter training run (composed below), all 100 tasks.
    "cpu": LINREG_TRAINING_CPU,
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="App. E (Eqs. 27–31)",
    description="token-by-token factorized dynamics: output kept at every step (Eq 28), product form of W_n (Eq 31)",
    needs=("linreg_icl",),  # checkpoint=RUN of linreg_icl: its trained block, not one trained here
    schema=FactorizationConfig,
    presets=PRESETS,
)
