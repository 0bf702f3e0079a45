"""Gemma 3 (text `gemma3_text`, multimodal `gemma3`): Gemma3DecoderLayer.

    v = x + N_post_attn(Attn(N_in(x)))   z = N_pre_ff(v)   d = W_down(gelu_tanh(W_gate z) ⊙ W_up z)
    T = v + m ⊙ d / RMS(d),   m = 1 + post_feedforward_layernorm.weight

Input matrices W_gate, W_up (Thm 7); the post-MLP RMSNorm's scale absorbs r (Thm 10). App. B's stable
update (ΔW_down from the RMSNorm inversion, then Δm for the remainder: app_b.py) applies: the block has
the post-MLP norm it needs (`pre_norm_matrix`), as does the conditioned variant, and the closed loop also
patches W_down, so that Thm 10 divides by ±1 instead of by MLP outputs near 0 (closed_loop.py).
"""

from experiments.patching.arch.base import LINEAR, BlockAdapter
from experiments.patching.families import said_by
from experiments.patching.rules import SCALE

# tiny-gemma3 is one of the zoo's own offline Gemma models (its vision variant and processor live there too)
from experiments.zoo.gemma import tiny_text_config as tiny_config

ADAPTER = BlockAdapter(
    **said_by("gemma3"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    # Gemma3ForCausalLM.model is the text model; Gemma3ForConditionalGeneration.model.language_model
    decoder=lambda model: getattr(model.model, "language_model", model.model),
    layers_attr="layers",
    input_matrices={"mlp.gate_proj.weight": LINEAR, "mlp.up_proj.weight": LINEAR},
    output_rule=SCALE,
    output_param="post_feedforward_layernorm.weight",
    residual_at="pre_feedforward_layernorm",
    captures={"d": ("post_feedforward_layernorm", "input"), "h": ("mlp.down_proj", "input")},
    pre_norm_matrix="mlp.down_proj.weight",
    scale_offset=1.0,  # Gemma3RMSNorm scales by 1 + weight
    tiny_config=tiny_config,  # zoo/gemma.py's: tiny-gemma3 is built there
)
