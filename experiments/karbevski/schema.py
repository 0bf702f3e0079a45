"""What Karbevski & Mijoski's experiments' config classes share, or what other modules import by name: gpt_wq's
Table 2 variants (an Enum, so `variant=baseline` fails while composing) and its training loop's keys (read by
gpt/train.py too). Each experiment's config class and presets are in its home
(experiments/karbevski/<name>/__init__.py); a node used by one experiment alone lives there with it.
Torch-free: imported before every composition."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from experiments.core.config_schema import MISSING


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
