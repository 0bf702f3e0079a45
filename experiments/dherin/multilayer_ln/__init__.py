"""multilayer_ln — Dherin et al. App. C.1, Fig. 5.

Dherin et al. App. C.1, Fig. 5: a stack of L = 10 post-LN transformer blocks trained on in-context
linear regression; removing the context is absorbed into every block's W₁ (rank-1 ΔW) and b₂ (δA),
computed first block to last, and every block's output at the query is unchanged.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, section
from experiments.core.registry import Experiment
from experiments.dherin.schema import SMALL_OPS_THREADS, LinregTask, LinregTrain


@dataclass
class StackModel:
    n_layers: int = 10  # paper: L = 10
    d_model: int = 32  # paper: d_model = 32 (tokens are read in from d+1 to d_model; see models/post_ln_stack.py)
    n_heads: int = 8  # paper: h = 8, d_k = d_model / h
    d_mlp: int = 128  # paper: d_mlp = 128


@dataclass
class StackPatch:
    # Y = the first k examples (an integer 1..N; multilayer_ln.validate checks it); null = all of C (the paper's Y = C)
    remove_first: int | None = None


@dataclass
class StackEval:
    n_val_tasks: int = 500  # fixed held-out validation set (its own seed, the same across runs)
    val_seed: int = 12345
    block_tasks: int = 100  # Fig. 5 right: test tasks for the per-block output differences (paper: 100)
    chunk: int = 500  # prompts per forward pass (memory knob)


@dataclass
class MultilayerLnConfig(Common):
    """multilayer_ln (App. C.1, Fig. 5): a stack of post-LN blocks."""

    threads: int | None = SMALL_OPS_THREADS
    task: LinregTask = section(LinregTask)
    model: StackModel = section(StackModel)
    # The paper does not give these; chosen so the stack learns the task on CPU in minutes (AdamW, no weight
    # decay, gradient norm clipped at 1).
    train: LinregTrain = section(LinregTrain, steps=1000, batch_size=32, lr=1.0e-3, eval_every=100)
    patch: StackPatch = section(StackPatch)
    eval: StackEval = section(StackEval)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a 3-block stack, a short context and a few steps (the model does not
    # learn the task; the learning claim is then reported as failed, the equivalence claims still hold).
    "smoke": {
        "task": {
            "n_examples": 20,
        },
        "model": {
            "n_layers": 3,
        },
        "train": {
            "steps": 20,
            "eval_every": 10,
        },
        "eval": {
            "n_val_tasks": 64,
            "block_tasks": 16,
        },
    },
    # Minutes on a 2-core laptop: fewer steps, a smaller validation set.
    "cpu": {
        "train": {
            "steps": 400,
        },
        "eval": {
            "n_val_tasks": 200,
        },
    },
}

EXPERIMENT = Experiment(
    paper="Dherin et al.",
    figures="Fig. 5",
    description="10-block post-LN transformer: the context moved into every block's W₁ and b₂, first block to last",
    schema=MultilayerLnConfig,
    presets=PRESETS,
)
