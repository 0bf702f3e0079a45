"""Mixtral: MixtralDecoderLayer with a sparse mixture of experts.

    v = x + Attn(N_in(x))   z = N_post_attn(v)
    T = v + Σ_{j ∈ top-k(R z)} g_j W_down,j(silu(W_gate,j z) ⊙ W_up,j z),   g = softmax over the top k

The router R reads z: it is an input matrix and gets the input update, so the patched router sees z_C
and the same experts fire with the same gates (Thm 11). Every expert's gate/up (stacked as
`experts.gate_up_proj`, (E, 2I, d)) gets the input update too; each active expert's W_down,j absorbs
r / S by a rank-1 update (S = Σ g_j = 1 after Mixtral's renormalization).
"""

from experiments.patching.arch.base import EXPERTS, LINEAR, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import MOE


def tiny_config(vocab_size: int):
    """tiny-mixtral: 4 layers, d = 64, 4 experts of width 96, 2 active per token, no sliding window."""
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                         max_position_embeddings=4096, sliding_window=None, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("mixtral"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.model,
    layers_attr="layers",
    input_matrices={"mlp.gate.weight": LINEAR, "mlp.experts.gate_up_proj": EXPERTS},
    output_rule=MOE,
    output_param="mlp.experts.down_proj",
    residual_at="post_attention_layernorm",
    captures={"router": ("mlp.gate", "output")},
    tiny_config=tiny_config,
    # one expert at a time (MixtralExperts' own loop): the MoE rule computes each active expert's hidden
    # state the same way, and the grouped-GEMM kernel has no float64
    load_kwargs={"experts_implementation": "eager"},
)
