"""Dherin et al.'s experiments, their keys, types and paper defaults: linreg_icl, the three that train or
load its model (dw_convergence, finetune_compare and factorization: PretrainedLinreg's subclasses, with
linreg_icl's task, architecture and training, and keys of their own), multilayer_ln's stack and
rnn_context. The types make composition refuse `train.steps=1.5` or a key that does not exist; ranges and
cross-key rules stay in each experiment's validate(). What a preset changes is in conf/preset_for/<name>/.

Torch-free: registered before every composition (experiments/core/config_schema.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from omegaconf import MISSING

from experiments.core.config_schema import experiment_schemas, section


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
    """linreg_icl (§4.1–4.2, Fig. 2)."""

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


@dataclass
class DwConvergence(PretrainedLinreg):
    """dw_convergence (§3, §4.3, Fig. 3)."""

    dynamics: Dynamics = section(Dynamics)


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
class FinetuneCompare(PretrainedLinreg):
    """finetune_compare (§4.4, Fig. 4)."""

    finetune: Finetune = section(Finetune)


@dataclass
class Factorization:
    n_tasks: int = 100  # prompts checked (the paper gives no number; 100 as in Figs 3–5)
    data_seed: int = 7077  # the prompts' own seed
    float64: bool = True  # also check in float64 (a float64 copy of the same trained weights)


@dataclass
class FactorizationExperiment(PretrainedLinreg):
    """factorization (App. E)."""

    factorization: Factorization = section(Factorization)


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


# Small ops: 1 thread is as fast as 2 on an idle 2-core CPU at less CPU time, and far faster on a busy one;
# null = torch default. multilayer_ln's and rnn_context's default.
SMALL_OPS_THREADS = 1


@dataclass
class MultilayerLn:
    """multilayer_ln (App. C.1, Fig. 5): a stack of post-LN blocks."""

    threads: int | None = SMALL_OPS_THREADS
    task: LinregTask = section(LinregTask)
    model: StackModel = section(StackModel)
    # The paper does not give these; chosen so the stack learns the task on CPU in minutes (AdamW, no weight
    # decay, gradient norm clipped at 1).
    train: LinregTrain = section(LinregTrain, steps=1000, batch_size=32, lr=1.0e-3, eval_every=100)
    patch: StackPatch = section(StackPatch)
    eval: StackEval = section(StackEval)


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
class RnnContext:
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


# Each experiment's schema, registered by config_schema.register_schemas (experiment_schema binds it to
# this module as <Name>Config).
# experiment name -> schema, each name from its class name (SystemCompile -> system_compile)
SCHEMAS = experiment_schemas(LinregIcl, DwConvergence, FinetuneCompare, FactorizationExperiment, MultilayerLn,
                             RnnContext)
