"""Typed schema of gpt_wq (conf/experiment/gpt_wq.yaml): the five Table 2 variants as an Enum, the
GPT's shape and the training loop's keys as typed nodes, so `variant=baseline` or `train.lr=fast`
fails while composing. Range and cross-key checks (divisibility, CUDA, prepared data) stay in
gpt_wq.validate. Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from omegaconf import MISSING

from experiments.core.config_schema import GROUP, experiment_schema


class GptVariant(StrEnum):
    """Table 2's columns, in experiments/karbevski/gpt/variants.py's order (VARIANTS), and `all`
    (tests/karbevski/test_gpt_wq_schema.py keeps the two lists equal)."""

    baseline_small_mlp = "baseline_small_mlp"
    baseline_small_d = "baseline_small_d"
    wq_identity_117m = "wq_identity_117m"
    baseline_124m = "baseline_124m"
    wq_identity_large_mlp = "wq_identity_large_mlp"
    all = "all"


@dataclass
class GptShape:
    """The base shape; each variant derives its GPTConfig from it (gpt/variants.py: model_config)."""

    n_layer: int = MISSING
    n_head: int = MISSING
    d_model: int = MISSING
    block_size: int = MISSING
    vocab_size: int = MISSING


@dataclass
class GptTrain:
    """The config side of gpt/train.py's TrainSettings (gpt_wq.settings turns it into one: per-rank
    grad_accum, decay over train.steps when decay_steps is null, the variant's weight decay when
    weight_decay is null); val_windows and val_seed choose the validation set."""

    steps: int = MISSING
    micro_batch: int = MISSING
    grad_accum: int = MISSING
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_steps: int = MISSING
    decay_steps: int | None = MISSING
    weight_decay: float | None = MISSING
    beta1: float = MISSING
    beta2: float = MISSING
    grad_clip: float = MISSING
    eval_every: int = MISSING
    val_windows: int = MISSING
    val_seed: int = MISSING
    eval_batch: int = MISSING
    log_every: int = MISSING
    checkpoint_every: int = MISSING
    compile: bool = MISSING


@dataclass
class GptWq:
    variant: GptVariant = MISSING
    model: GptShape = field(default_factory=GptShape)
    data: str = MISSING  # gpt_wq.validate names the sources (SOURCES)
    text_file: str | None = MISSING
    tokenizer: str = MISSING  # gpt_wq.validate names the tokenizers (TOKENIZERS)
    cache_dir: str | None = MISSING
    val_fraction: float = MISSING
    train: GptTrain = field(default_factory=GptTrain)
    require_gpu: bool = MISSING
    resume: str | None = MISSING
    export_hf: bool = MISSING


GptWqConfig = experiment_schema(GptWq)  # a module attribute, so a composed config pickles


def register(store) -> None:
    store.store(group=GROUP, name="gpt_wq", node=GptWqConfig, package="_global_")
