"""What Dherin et al.'s experiments' config classes share: linreg_icl's task, model, training and evaluation
nodes, its keys (LinregIcl) and PretrainedLinreg (linreg_icl's keys and `checkpoint`, for dw_convergence,
finetune_compare and factorization, which train or load its model), the dynamics node, and linreg_icl's
shorter training at preset=cpu. Each experiment's config class and presets are in its home
(experiments/dherin/<name>/__init__.py); a node used by one experiment alone lives there with it. The types make
composition refuse `train.steps=1.5` or a key that does not exist; ranges and cross-key rules stay in each
experiment's validate(). Torch-free: imported before every composition."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import MISSING, section


@dataclass
class LinregTask:
    d: int = 2  # input dimension (paper: d = 2)
    n_examples: int = 100  # N in-context examples per prompt (paper: N = 100)


@dataclass
class LinregModel:
    """linreg_icl's one-block transformer (also rnn_context's attention baseline)."""

    d_model: int = 32  # paper: d_model = 32
    n_heads: int = 8  # paper: h = 8, d_k = d_model / h
    d_mlp: int = 128  # paper: d_mlp = 128
    attn_skip: bool = True  # A(C, x) = x + MHA(C, x), the standard block's attention residual
    mlp_skip: bool = False  # paper §4: no MLP skip. true = Theorem B.2's block, patched by ΔW and Δb′ = δA


@dataclass
class LinregTrain:
    """The `train:` node, and the base of experiments/dherin/training.py's TrainSettings (which adds the
    task's shape): one declaration of the loop's knobs. Defaults only where the loop has one; each
    experiment gives the others (`section(LinregTrain, steps=...)`)."""

    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING  # AdamW
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0  # gradient-norm clip; null: none
    eval_every: int = MISSING  # a checkpoint: validation losses computed both ways


@dataclass
class LinregEval:
    n_val_tasks: int = 1000  # fixed held-out validation set (its own seed, the same across runs)
    val_seed: int = 12345
    grid_tasks: int = 100  # Fig. 2 right: fresh tasks averaged per grid point (paper: 100)
    grid_size: int = 40  # points per axis; even, so the grid avoids x = 0 where A(x) = 0 and ΔW is undefined
    grid_range: float = 3.0  # x1, x2 in [-grid_range, grid_range]
    chunk: int = 2048  # prompts per forward pass on the grid (memory knob)


@dataclass
class LinregIcl:
    """linreg_icl's keys (§4.1–4.2, Fig. 2): its config class is LinregIclConfig (experiments/dherin/linreg_icl/),
    and the experiments that train or load its model share them (PretrainedLinreg)."""

    # One intra-op thread: the model is tiny (d_model 32), so a second thread has little to split, and on a
    # 2-core machine shared with other work torch's default of 2 threads makes each training step an order
    # of magnitude slower (docs/usage.md). threads=2 puts it back.
    threads: int | None = 1
    task: LinregTask = section(LinregTask)
    model: LinregModel = section(LinregModel)
    # The paper does not give these; chosen so the model learns the task on CPU in minutes. AdamW, no weight
    # decay, gradient norm clipped at 1.
    train: LinregTrain = section(LinregTrain, steps=4000, batch_size=64, lr=1.0e-3, eval_every=100)
    eval: LinregEval = section(LinregEval)


@dataclass
class PretrainedLinreg(LinregIcl):
    """linreg_icl's task, model and training, for the experiments that take its model: trained in the run
    exactly as linreg_icl trains it, or loaded (experiments/dherin/pretrained.py)."""

    checkpoint: str | None = None  # a linreg_icl run folder or its model.pt; null = train here with train.*


@dataclass
class Dynamics:
    n_tasks: int = 100  # Fig. 3: mean ± s.e. over 100 tasks (paper: 100 trials)
    data_seed: int = 2024  # the tasks' own seed (the same tasks whatever the training seed)
    tail_fraction: float = 0.1  # decay claim: mean increment over the last 10% of i vs the first 10%


# linreg_icl's cpu training, shared by the experiments that train its model when given no checkpoint
# (dw_convergence, finetune_compare, factorization): their cpu presets start from it (config_schema.merged), so
# the shorter run is written once.
LINREG_TRAINING_CPU = {
    "train": {
        "steps": 1500,
    },
    "eval": {
        "n_val_tasks": 500,
    },
}


# Small ops: 1 thread is as fast as 2 on an idle 2-core CPU at less CPU time, and far faster on a busy one;
# null = torch default. multilayer_ln's and rnn_context's default.
SMALL_OPS_THREADS = 1
