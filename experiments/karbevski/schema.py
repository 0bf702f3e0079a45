"""Typed schemas of Karbevski & Mijoski's experiments. gpt_wq (conf/experiment/gpt_wq.yaml): the five
Table 2 variants as an Enum, the GPT's shape and the training loop's keys as typed nodes, so
`variant=baseline` or `train.lr=fast` fails while composing; wq_reparam, attention_scale and
basis_transfer likewise. Range and cross-key checks (divisibility, CUDA, prepared data) stay in each
experiment's validate(). Torch-free: registered before every composition."""

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
    """The `train:` node, and the base of gpt/train.py's TrainSettings: one declaration of the loop's
    knobs. gpt_wq.settings makes a rank's TrainSettings from it (grad_accum per rank, the variant's weight
    decay when weight_decay is null); decay_steps null decays over `steps`. val_windows and val_seed
    choose the validation set (gpt_wq reads them, the loop does not). The loop's knobs default to
    nanoGPT's values, for settings built by hand (tests, benchmarks); the yaml gives every key."""

    steps: int = MISSING
    micro_batch: int = MISSING  # sequences per forward pass per rank
    grad_accum: int = MISSING  # micro-batches per optimizer step (in the config: over all ranks)
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_steps: int = MISSING
    decay_steps: int | None = None  # cosine horizon; past it the lr stays at min_lr; null: steps
    weight_decay: float | None = None  # null: the variant's
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 1000
    val_windows: int = MISSING  # no default: only gpt_wq reads them, from the config
    val_seed: int = MISSING
    eval_batch: int = 8
    log_every: int = 10
    checkpoint_every: int = 1000
    compile: bool = False


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


@dataclass
class ReluCheck:
    h: int = MISSING
    m: int = MISSING
    j_size: int = MISSING
    samples: int = MISSING


@dataclass
class Remark5:
    dims: list[int] = MISSING
    samples_per_dim: int = MISSING
    scale: float = MISSING
    eps: float = MISSING


@dataclass
class NanoGptShape:
    d_model: int = MISSING
    layers: int = MISSING
    vocab: int = MISSING
    block_size: int = MISSING


@dataclass
class ReparamClaims:
    exact_tolerance: float = MISSING
    control_min: float = MISSING
    remark5_slope_max: float = MISSING


@dataclass
class WqReparam:
    d_model: int = MISSING
    heads: int = MISSING
    layers: int = MISSING
    d_ff: int = MISSING
    vocab: int = MISSING
    seq_len: int = MISSING
    batch: int = MISSING
    ln_eps: float = MISSING
    trials: int = MISSING
    wq_rank: int | None = MISSING
    relu: ReluCheck = field(default_factory=ReluCheck)
    remark5: Remark5 = field(default_factory=Remark5)
    nanogpt: NanoGptShape = field(default_factory=NanoGptShape)
    claims: ReparamClaims = field(default_factory=ReparamClaims)


@dataclass
class ScaleSweep:
    d_k: int = MISSING
    d_models: list[int] = MISSING
    heads: list[int] = MISSING


@dataclass
class ScaleClaims:
    std_rel_tolerance: float = MISSING
    ratio_tolerance: float = MISSING
    ratio_rel_tolerance: float = MISSING


@dataclass
class AttentionScale:
    sigma: float = MISSING
    d_model: int = MISSING
    heads: int = MISSING
    seq_len: int = MISSING
    sequences: int = MISSING
    weight_draws: int = MISSING
    embedding_std: float = MISSING
    ln_eps: float = MISSING
    sweep: ScaleSweep = field(default_factory=ScaleSweep)
    claims: ScaleClaims = field(default_factory=ScaleClaims)


@dataclass
class BasisTrain:
    steps: int = MISSING
    batch: int = MISSING
    lr: float = MISSING
    weight_decay: float = MISSING
    clip: float = MISSING
    log_every: int = MISSING


@dataclass
class Ridge:
    lam: float = MISSING
    samples: int = MISSING


@dataclass
class BasisClaims:
    max_spread: float = MISSING


@dataclass
class BasisTransfer:
    widths: list[int] = MISSING
    mult: int = MISSING
    eval_samples: int = MISSING
    chunk: int = MISSING
    warn_after_s: int = MISSING  # seconds
    train: BasisTrain = field(default_factory=BasisTrain)
    ridge: Ridge = field(default_factory=Ridge)
    claims: BasisClaims = field(default_factory=BasisClaims)


# Module attributes, so a composed config pickles (the joblib launcher sends it to its workers).
GptWqConfig = experiment_schema(GptWq)
WqReparamConfig = experiment_schema(WqReparam)
AttentionScaleConfig = experiment_schema(AttentionScale)
BasisTransferConfig = experiment_schema(BasisTransfer)

SCHEMAS = {"gpt_wq": GptWqConfig, "wq_reparam": WqReparamConfig, "attention_scale": AttentionScaleConfig,
           "basis_transfer": BasisTransferConfig}


def register(store) -> None:
    for name, node in SCHEMAS.items():
        store.store(group=GROUP, name=name, node=node, package="_global_")
