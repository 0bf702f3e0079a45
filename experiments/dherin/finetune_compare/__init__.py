"""finetune_compare — Dherin et al. §4.4, Fig. 4: the implicit update ΔW(C_i) vs explicit finetuning.

Dherin et al. §4.4, Fig. 4: finetune only W by SGD on the context's examples, one at a time in
context order, and compare with the implicit update ΔW(C_i): test loss and alignment.
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
class Finetune:
    n_trials: int = 100  # Fig. 4: mean ± s.e. over 100 trials; M = task.n_examples (paper: M = N)
    data_seed: int = 4048  # ω_test, x_1..x_M, x_test: their own seed, the same for every lr of a sweep
    # SGD step size (the paper does not give one). 0.3: on the paper preset with the linreg_icl paper
    # model, a sweep lr ∈ {0.003, 0.01, 0.03, 0.1, 0.3, 1.0} gave mean GD test loss over i = 0..M of
    # 0.84, 0.74, 0.61, 0.47, 0.35, 0.57: 0.3 learns fastest over the whole curve while staying
    # stable (1.0 ends lower at i = M but overshoots early). The alignment with ΔW hardly depends on
    # it (0.18–0.20 at i = M for every lr). Sweep: icl-exp run finetune_compare -m finetune.lr=0.03,0.3,1
    lr: float = 0.3


@dataclass
class FinetuneCompareConfig(PretrainedLinreg, Common):
    """finetune_compare (§4.4, Fig. 4)."""

    finetune: Finetune = section(Finetune)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a short context, a few training steps, few trials (the model does not
    # learn the task; the learning claims then fail, the exactness claim still holds).
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
        "finetune": {
            "n_trials": 12,
        },
    },
    # Minutes on a 2-core laptop: linreg_icl's shorter training run (composed below), all 100 trials.
    "cpu": LINREG_TRAINING_CPU,
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="Fig. 4",
    description="implicit update ΔW(C_i) vs finetuning W by SGD on the same examples: test loss and alignment",
    needs=("linreg_icl",),  # checkpoint=RUN of linreg_icl: its trained block, not one trained here
    schema=FinetuneCompareConfig,
    presets=PRESETS,
)
