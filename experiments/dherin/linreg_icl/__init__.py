"""linreg_icl — Dherin et al. §4.1–4.2, Fig. 2.

Dherin et al. §4.1–4.2, Fig. 2: a one-block transformer trained on in-context linear
regression; its prediction with the context equals its prediction without the context once
the first MLP matrix is patched by the rank-1 ΔW of Eq. 2.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, merged
from experiments.core.registry import Experiment
from experiments.dherin.schema import LINREG_TRAINING_CPU, LinregIcl


@dataclass
class LinregIclConfig(LinregIcl, Common):
    """linreg_icl (§4.1–4.2, Fig. 2). Its keys are LinregIcl's (experiments/dherin/schema.py), shared
    with the experiments that train or load its model."""


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a short context and a few steps (the model does not learn the task;
    # the learning claim is then reported as failed, the equivalence claims still hold).
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
            "grid_tasks": 8,
            "grid_size": 6,
        },
    },
    # Minutes on a 2-core laptop: fewer steps (the shared linreg training preset), a coarser grid.
    "cpu": merged(LINREG_TRAINING_CPU, {
        "eval": {
            "grid_size": 20,
        },
    }),
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="Fig. 2",
    description="in-context linear regression: prediction with context = prediction via the rank-1 ΔW patch",
    schema=LinregIclConfig,
    presets=PRESETS,
)
