"""OLMo 2 (AI2's fully open decoder): Olmo2DecoderLayer, norms after each sublayer, none before.

    v = x + N_post_attn(Attn(x))   z = v   d = W_down(silu(W_gate z) ⊙ W_up z)
    T = v + m ⊙ d / RMS(d),   m = post_feedforward_layernorm.weight

The MLP reads the residual itself (no pre-MLP norm): z = v, so v is read at the MLP's input and the input
update of W_gate, W_up (Thm 7) makes them see v_C. The post-MLP RMSNorm's scale absorbs r (Thm 10), as in
Gemma 3, except that OLMo 2 stores m itself where Gemma stores m − 1 (Δm is the same either way).
The closed loop patches W_down too (`pre_norm_matrix`), so that Thm 10 divides by ±1 (closed_loop.py), and
App. B's open-loop variants (stable, conditioned: app_b.py) apply as on Gemma 3, with m = weight.
"""

from experiments.patching.arch.base import LINEAR, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import SCALE


def tiny_config(vocab_size: int):
    """tiny-olmo2: 4 layers, d = 64, GQA 4:2 with OLMo 2's q/k norms, SwiGLU 128."""
    from transformers import Olmo2Config

    return Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=4096, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("olmo2"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.model,
    layers_attr="layers",
    input_matrices={"mlp.gate_proj.weight": LINEAR, "mlp.up_proj.weight": LINEAR},
    output_rule=SCALE,
    output_param="post_feedforward_layernorm.weight",
    residual_at="mlp",  # no pre-MLP norm: the MLP's input is v itself
    captures={"d": ("post_feedforward_layernorm", "input"), "h": ("mlp.down_proj", "input")},
    pre_norm_matrix="mlp.down_proj.weight",
    tiny_config=tiny_config,
)
