"""Llama (and Mistral-style dense blocks): LlamaDecoderLayer.

    v = x + Attn(N_in(x))   z = N_post_attn(v)   T = v + W_down(silu(W_gate z) ⊙ W_up z)

Input matrices W_gate, W_up (Thm 7); W_down absorbs r by a rank-1 update (Thm 9). No post-MLP norm:
App. B's stable update does not apply.
"""

from experiments.patching.arch.base import LINEAR, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import OUTER_WEIGHT


def tiny_config(vocab_size: int):
    """tiny-llama: 4 layers, d = 64, GQA 4:2, SwiGLU 128."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=4096, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("llama"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.model,
    layers_attr="layers",
    input_matrices={"mlp.gate_proj.weight": LINEAR, "mlp.up_proj.weight": LINEAR},
    output_rule=OUTER_WEIGHT,
    output_param="mlp.down_proj.weight",
    residual_at="post_attention_layernorm",
    captures={"y": ("mlp.down_proj", "input")},
    tiny_config=tiny_config,
)
