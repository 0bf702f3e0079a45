"""GPT-J: GPTJBlock, a parallel block.

    a = Attn(LN_1(x))   z = LN_1(x)   T = x + a + fc_out(gelu_new(fc_in z))

The MLP reads LN_1(x), never the attention output (Thm 12): for the token alone at its target input
z = z_C and the input update is zero; the whole attention change goes into fc_out's bias (Thm 8).
When the patched pass's own input differs from the target (closed loop) fc_in gets the input update.
"""

from experiments.patching.arch.base import LINEAR, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import OUTER_BIAS


def tiny_config(vocab_size: int):
    """tiny-gptj: 4 layers, d = 64, 4 heads, rotary on the first 8 of each head's 16 dimensions."""
    from transformers import GPTJConfig

    return GPTJConfig(n_embd=64, n_layer=4, n_head=4, rotary_dim=8, n_positions=1024, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("gptj"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.transformer,
    layers_attr="h",
    input_matrices={"mlp.fc_in.weight": LINEAR},
    output_rule=OUTER_BIAS,
    output_param="mlp.fc_out.bias",
    attention="attn",
    tiny_config=tiny_config,
)
