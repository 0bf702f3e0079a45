"""How many sequences of a training micro-batch fit in a device's free memory: an estimate from the
model's shape, for benchmarks/gpt_wq_bench.py --batch auto. Not measured on a card here; it errs large
(a margin on the activations and a share of the memory left free) so that the pick does not run out.

Training state: float32 weights, gradients and AdamW's two moments, 16 bytes a parameter, plus a 2-byte
copy of each weight under bfloat16 autocast. Activations kept for the backward, per token and layer (the
block's tensors that autograd saves, counted in model.py's forward): the float32 residual stream at both
LayerNorms (2 × 4d bytes), and in the compute dtype (2 bytes under bf16 autocast, 4 in float32) the
attention's input, q, k, v, its output and its contiguous copy (7d in all with the MLP's input) and the
MLP's hidden layer before and after GELU (2h). Flash attention keeps no T × T scores. Beside the blocks:
the embedding sum, ln_f and the loss's hidden-state gradient (about 16d bytes a token) and one chunk of
logits (lm_loss: the compute-dtype logits, their float32 copy and the gradient, chunk × vocab).
"""

from __future__ import annotations

from experiments.karbevski.gpt.lm_loss import DEFAULT_CHUNK
from experiments.karbevski.gpt.model import GPTConfig

ACTIVATION_MARGIN = 1.25  # what the count above leaves out: the backward's transient gradients, workspace
FREE_SHARE = 0.9  # of the free memory: the allocator's fragmentation, the CUDA context's growth


def state_bytes(n_params: int, bf16: bool) -> int:
    return n_params * (16 + (2 if bf16 else 0))


def loss_bytes(cfg: GPTConfig, bf16: bool, chunk: int = DEFAULT_CHUNK) -> int:
    logits = chunk * cfg.vocab_size * ((2 if bf16 else 0) + 4 + (2 if bf16 else 4))
    return logits + cfg.vocab_size * cfg.d_model * 4  # + the head weight's float32 gradient sum


def activation_bytes_per_token(cfg: GPTConfig, bf16: bool) -> float:
    act = 2 if bf16 else 4
    per_layer = 2 * 4 * cfg.d_model + act * (7 * cfg.d_model + 2 * cfg.mlp_hidden)
    return ACTIVATION_MARGIN * (cfg.n_layer * per_layer + 16 * cfg.d_model)


def fit_micro_batch(cfg: GPTConfig, n_params: int, free_bytes: int, bf16: bool) -> int:
    """The largest number of sequences of cfg.block_size tokens whose training step fits in
    FREE_SHARE of `free_bytes`; 0 when not even the training state fits."""
    room = FREE_SHARE * free_bytes - state_bytes(n_params, bf16) - loss_bytes(cfg, bf16)
    per_sequence = activation_bytes_per_token(cfg, bf16) * cfg.block_size
    return max(int(room // per_sequence), 0)
