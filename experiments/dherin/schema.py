"""Typed schemas of Dherin et al.'s experiments: linreg_icl, the three that train or load its model
(dw_convergence, finetune_compare, factorization), multilayer_ln's stack and rnn_context. Each is the
structure of conf/experiment/<name>.yaml, whose values stay in the yaml; the schema says what type a
key takes, so composition rejects `train.steps=1.5` or a key that does not exist. Ranges and
cross-key rules stay in each experiment's validate().

Torch-free: registered before every composition (experiments/core/config_schema.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from experiments.core.config_schema import GROUP, experiment_schema


@dataclass
class LinregTask:
    d: int = MISSING  # input dimension
    n_examples: int = MISSING  # in-context examples per prompt


@dataclass
class LinregModel:
    d_model: int = MISSING
    n_heads: int = MISSING
    d_mlp: int = MISSING
    attn_skip: bool = MISSING
    mlp_skip: bool = MISSING


@dataclass
class LinregTrain:
    """The `train:` node, and the base of experiments/dherin/training.py's TrainSettings (which adds the
    task's shape): one declaration of the loop's knobs. Defaults only where the loop has one."""

    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0  # gradient-norm clip; null: none
    eval_every: int = MISSING


@dataclass
class LinregEval:
    n_val_tasks: int = MISSING
    val_seed: int = MISSING
    grid_tasks: int = MISSING
    grid_size: int = MISSING
    grid_range: float = MISSING
    chunk: int = MISSING


@dataclass
class LinregIcl:
    task: LinregTask = field(default_factory=LinregTask)
    model: LinregModel = field(default_factory=LinregModel)
    train: LinregTrain = field(default_factory=LinregTrain)
    eval: LinregEval = field(default_factory=LinregEval)


@dataclass
class Dynamics:
    n_tasks: int = MISSING
    data_seed: int = MISSING
    tail_fraction: float = MISSING


@dataclass
class DwConvergence(LinregIcl):
    checkpoint: str | None = None  # a linreg_icl run folder or its model.pt
    dynamics: Dynamics = field(default_factory=Dynamics)


@dataclass
class Finetune:
    n_trials: int = MISSING
    data_seed: int = MISSING
    lr: float = MISSING


@dataclass
class FinetuneCompare(LinregIcl):
    checkpoint: str | None = None
    finetune: Finetune = field(default_factory=Finetune)


@dataclass
class Factorization:
    n_tasks: int = MISSING
    data_seed: int = MISSING
    float64: bool = MISSING


@dataclass
class FactorizationExperiment(LinregIcl):
    checkpoint: str | None = None
    factorization: Factorization = field(default_factory=Factorization)


@dataclass
class StackModel:
    n_layers: int = MISSING
    d_model: int = MISSING
    n_heads: int = MISSING
    d_mlp: int = MISSING


@dataclass
class StackPatch:
    remove_first: int | None = MISSING  # k of Y = the first k examples; multilayer_ln.validate checks 1..N


@dataclass
class StackEval:
    n_val_tasks: int = MISSING
    val_seed: int = MISSING
    block_tasks: int = MISSING
    chunk: int = MISSING


@dataclass
class MultilayerLn:
    task: LinregTask = field(default_factory=LinregTask)
    model: StackModel = field(default_factory=StackModel)
    train: LinregTrain = field(default_factory=LinregTrain)
    patch: StackPatch = field(default_factory=StackPatch)
    eval: StackEval = field(default_factory=StackEval)


@dataclass
class RnnModel:
    d_model: int = MISSING
    d_mlp: int = MISSING
    nonlinearity: str = MISSING  # relu | tanh (models/rnn.py says which)


@dataclass
class AttentionTrain:
    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    grad_clip: float | None = MISSING


@dataclass
class AttentionBaseline:
    """rnn_context's attention model, linreg_icl's block: trained in the run or loaded."""

    checkpoint: str | None = MISSING
    model: LinregModel = field(default_factory=LinregModel)
    train: AttentionTrain = field(default_factory=AttentionTrain)


@dataclass
class RnnEval:
    n_val_tasks: int = MISSING
    val_seed: int = MISSING
    chunk: int = MISSING


@dataclass
class RnnDynamics(Dynamics):
    decay_bar: float = MISSING


@dataclass
class RnnContext:
    task: LinregTask = field(default_factory=LinregTask)
    model: RnnModel = field(default_factory=RnnModel)
    train: LinregTrain = field(default_factory=LinregTrain)
    attention: AttentionBaseline = field(default_factory=AttentionBaseline)
    eval: RnnEval = field(default_factory=RnnEval)
    dynamics: RnnDynamics = field(default_factory=RnnDynamics)


# Module attributes, so a composed config pickles (the joblib launcher sends it to its workers).
LinregIclConfig = experiment_schema(LinregIcl)
DwConvergenceConfig = experiment_schema(DwConvergence)
FinetuneCompareConfig = experiment_schema(FinetuneCompare)
FactorizationConfig = experiment_schema(FactorizationExperiment)
MultilayerLnConfig = experiment_schema(MultilayerLn)
RnnContextConfig = experiment_schema(RnnContext)

SCHEMAS = {"linreg_icl": LinregIclConfig, "dw_convergence": DwConvergenceConfig,
           "finetune_compare": FinetuneCompareConfig, "factorization": FactorizationConfig,
           "multilayer_ln": MultilayerLnConfig, "rnn_context": RnnContextConfig}


def register(store) -> None:
    for name, node in SCHEMAS.items():
        store.store(group=GROUP, name=name, node=node, package="_global_")
