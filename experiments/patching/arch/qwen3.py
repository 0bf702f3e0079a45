"""Qwen 3: Qwen3DecoderLayer, Llama's block (the q/k RMSNorms inside attention do not touch Table 1).

    v = x + Attn(N_in(x))   z = N_post_attn(v)   T = v + W_down(silu(W_gate z) ⊙ W_up z)

Data only: the Llama adapter with its own model_type and tiny test model. What Algorithm 1 needs from the
block (where v and z are, the matrices reading z, W_down absorbing r by Thm 9) is checked against the stock
layer when the model is loaded (check.py).
"""

from dataclasses import replace

from experiments.patching.arch import llama
from experiments.patching.arch.base import tiny_common
from experiments.patching.families import said_by


def tiny_config(vocab_size: int):
    """tiny-qwen3: 4 layers, d = 64, GQA 4:2 with Qwen 3's q/k norms, head_dim 16, SwiGLU 128."""
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, **tiny_common(vocab_size))


# Llama's adapter under Qwen 3's record (patching/families.py: family, model_types, theorem, tiny_model)
ADAPTER = replace(llama.ADAPTER, **said_by("qwen3"), tiny_config=tiny_config)
