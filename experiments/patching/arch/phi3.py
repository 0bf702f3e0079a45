"""Phi-3: Phi3DecoderLayer, Llama's block with W_gate and W_up fused into one matrix.

    v = x + Attn(N_in(x))   z = N_post_attn(v)   [g; u] = W_gate_up z   T = v + W_down(silu(g) ⊙ u)

The one input matrix `gate_up_proj` (2I × d) reads z: the input update (Thm 7) is the same rank-1 update
on the fused matrix, both halves at once. W_down absorbs r (Thm 9). The residual dropouts are identities in
eval mode.
"""

from dataclasses import replace

from experiments.patching.arch import llama
from experiments.patching.arch.base import LINEAR, tiny_common
from experiments.patching.families import said_by


def tiny_config(vocab_size: int):
    """tiny-phi3: 4 layers, d = 64, GQA 4:2, fused gate/up 2 × 128."""
    from transformers import Phi3Config

    return Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, original_max_position_embeddings=4096,
                      **tiny_common(vocab_size))


# Llama's adapter with the fused input matrix: everything else (W_down, the residual, the capture) is Llama's
# (its record in patching/families.py says family, model_types, theorem, tiny_model)
ADAPTER = replace(llama.ADAPTER, **said_by("phi3"), input_matrices={"mlp.gate_up_proj.weight": LINEAR},
                  tiny_config=tiny_config)
