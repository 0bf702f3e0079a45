"""Parameter counts of Table 2, two independent ways: a closed formula, and the numel of a model built
on the meta device (shapes only, no memory), so the 124M model is counted on any laptop in milliseconds.

Conventions (the ones that reproduce Table 2): the vocabulary is padded to 50 304; the head is tied to
the token embedding, so it is counted once; "non-embedding" is everything but the token and position
embeddings (the blocks and the final LayerNorm).
"""

from __future__ import annotations

import torch

from experiments.karbevski.gpt.model import GPT, GPTConfig


def count_formula(cfg: GPTConfig) -> dict[str, int]:
    d, h = cfg.d_model, cfg.mlp_hidden
    projections = 3 if cfg.query == "learned" else 2  # W_Q, W_K, W_V or W_K, W_V
    per_block = 2 * d + projections * d * d + d * d + 2 * d * h  # ln_1, ln_2, c_attn, attn c_proj, MLP
    non_embedding = cfg.n_layer * per_block + d  # + ln_f
    embedding = cfg.vocab_size * d + cfg.block_size * d
    return {"total": non_embedding + embedding, "non_embedding": non_embedding}


def count_meta(cfg: GPTConfig) -> dict[str, int]:
    """Build the real module on the meta device and add up its (deduplicated, so tied once) parameters."""
    with torch.device("meta"):
        model = GPT(cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    return {"total": total, "non_embedding": total - embedding}
