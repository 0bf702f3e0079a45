"""Typed schemas of the in-context linear-regression experiments: linreg_icl and the three that train
or load its model (dw_convergence, finetune_compare, factorization). Each is the structure of
conf/experiment/<name>.yaml, whose values stay in the yaml; the schema says what type a key takes,
so composition rejects `train.steps=1.5` or a key that does not exist.

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
    """The keys experiments/dherin/training.py's TrainSettings is built from."""

    steps: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    grad_clip: float | None = MISSING
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


# Module attributes, so a composed config pickles (the joblib launcher sends it to its workers).
LinregIclConfig = experiment_schema(LinregIcl)
DwConvergenceConfig = experiment_schema(DwConvergence)
FinetuneCompareConfig = experiment_schema(FinetuneCompare)
FactorizationConfig = experiment_schema(FactorizationExperiment)

SCHEMAS = {"linreg_icl": LinregIclConfig, "dw_convergence": DwConvergenceConfig,
           "finetune_compare": FinetuneCompareConfig, "factorization": FactorizationConfig}


def register(store) -> None:
    for name, node in SCHEMAS.items():
        store.store(group=GROUP, name=name, node=node, package="_global_")
