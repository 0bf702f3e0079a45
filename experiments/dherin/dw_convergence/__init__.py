"""dw_convergence — Dherin et al. §3, §4.3, Fig. 3 (Proposition 3.1).

Dherin et al. §3, §4.3, Fig. 3: feed the context one example at a time; the prefix patches
(ΔW)_i = ΔW(C_i) form the implicit dynamics of Prop. 3.1, whose increments should vanish.
The model is linreg_icl's (same task, architecture and training settings: DwConvergence subclasses
PretrainedLinreg), trained in the run, or loaded with checkpoint=PATH.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment
from experiments.dherin.schema import LINREG_TRAINING_CPU, Dynamics, PretrainedLinreg


@dataclass
class DwConvergenceConfig(PretrainedLinreg, Common):
    """dw_convergence (§3, §4.3, Fig. 3)."""

    dynamics: Dynamics = section(Dynamics)


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
        "dynamics": {
            "n_tasks": 12,
        },
    },
    # Minutes on a 2-core laptop: linreg_icl's shorter training run (composed below), all 100 tasks.
    "cpu": LINREG_TRAINING_CPU,
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="Fig. 3",
    description="the prefix patches (ΔW)_i form gradient steps (Prop. 3.1) whose increments vanish with i",
    needs=("linreg_icl",),  # checkpoint=RUN of linreg_icl: its trained block, not one trained here
    schema=DwConvergenceConfig,
    presets=PRESETS,
)
