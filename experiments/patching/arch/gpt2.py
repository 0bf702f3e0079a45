"""GPT-2: GPT2Block (pre-LayerNorm with biases, Conv1D weights, GELU).

    v = x + Attn(LN_1(x))   z = LN_2(v)   T = v + c_proj(gelu(c_fc(z)))

Conv1D stores its weight as (in, out) and computes z W + b, so c_fc's effective matrix is Wᵀ: the input
update is applied transposed (layout CONV1D). c_proj's bias absorbs r (Thm 8).
"""

from experiments.patching.arch.base import CONV1D, BlockAdapter, tiny_common
from experiments.patching.families import said_by
from experiments.patching.rules import OUTER_BIAS


def tiny_config(vocab_size: int):
    """tiny-gpt2: 4 layers, d = 64, 4 heads, learned positions (which the open loop misses: test_arch)."""
    from transformers import GPT2Config

    return GPT2Config(n_embd=64, n_layer=4, n_head=4, n_positions=1024, **tiny_common(vocab_size))


ADAPTER = BlockAdapter(
    **said_by("gpt2"),  # family, model_types, theorem, tiny_model: its record in patching/families.py
    decoder=lambda model: model.transformer,
    layers_attr="h",
    input_matrices={"mlp.c_fc.weight": CONV1D},
    output_rule=OUTER_BIAS,
    output_param="mlp.c_proj.bias",
    residual_at="ln_2",
    absolute_positions=True,  # wpe: the query alone is at position 0, not after its context
    tiny_config=tiny_config,
)
