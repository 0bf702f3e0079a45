"""GPT-NeoX (Pythia): GPTNeoXLayer, a parallel block with two LayerNorms.

    a = Attn(LN_1(x))   z = LN_2(x)   T = x + a + W_out(gelu(W_in z) + b_in) + b_out

The MLP reads LN_2(x), never the attention output (Thm 12): the token alone at its target input has
z = z_C, the input update is zero, and the whole attention change r = a_C − a goes into W_out's bias
(Thm 8). The engine reads v = x + a and z at the MLP's input, so the same adapter describes a checkpoint
with `use_parallel_residual=False` (z = LN_2(x + a), T = x + a + MLP(z)): the input update then does the
work. Both are checked against the stock layer when loaded (check.py; tests/patching/test_families.py).
"""

from experiments.patching.arch.base import LINEAR, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import OUTER_BIAS


def tiny_config(vocab_size: int):
    """tiny-gpt-neox: 4 layers, d = 64, 4 heads, rotary on a quarter of each head (Pythia's), MLP 256."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         max_position_embeddings=4096, use_parallel_residual=True, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("gpt_neox"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.gpt_neox,
    layers_attr="layers",
    input_matrices={"mlp.dense_h_to_4h.weight": LINEAR},
    output_rule=OUTER_BIAS,
    output_param="mlp.dense_4h_to_h.bias",
    attention="attention",
    tiny_config=tiny_config,
)
