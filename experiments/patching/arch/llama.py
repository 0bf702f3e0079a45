"""Llama (and Mistral-style dense blocks): LlamaDecoderLayer.

    v = x + Attn(N_in(x))   z = N_post_attn(v)   T = v + W_down(silu(W_gate z) ⊙ W_up z)

Input matrices W_gate, W_up (Thm 7); W_down absorbs r by a rank-1 update (Thm 9). No post-MLP norm:
App. B's stable update does not apply.
"""

from experiments.patching.arch.base import LINEAR, OUTER_WEIGHT, BlockAdapter

ADAPTER = BlockAdapter(
    model_types=("llama", "mistral", "qwen2"),
    family="Llama",
    decoder=lambda model: model.model,
    layers_attr="layers",
    input_matrices={"mlp.gate_proj.weight": LINEAR, "mlp.up_proj.weight": LINEAR},
    output_rule=OUTER_WEIGHT,
    output_param="mlp.down_proj.weight",
    residual_at="post_attention_layernorm",
    captures={"y": ("mlp.down_proj", "input")},
    theorem="Thm 7 + Thm 9 (outer weight)",
)
