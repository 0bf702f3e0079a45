"""Tiny configs of the families that have no adapter file: written out for those the tests patch (newer
decoders whose block the structural reading must get right), shrunk from the stock config for the rest.

A family with an adapter file carries its own tiny config beside its adapter (`BlockAdapter.tiny_config`);
these are the others', the structural route's (structure.py), for its tests and for `icl-exp models`.
Every written-out one has 4 layers, d = 64 and a byte tokenizer's vocabulary, as the adapters' do; a hybrid
mixes its mixers (convolution or linear attention, then attention), an MoE has 4 experts of which 2 fire.
"""

from __future__ import annotations

from experiments.patching.arch.base import tiny_common

SHAPE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096)


def olmo3(vocab_size: int):
    """OLMo 3: OLMo 2's block (norms after each sublayer), sliding-window and full attention."""
    from transformers import Olmo3Config

    return Olmo3Config(intermediate_size=128, **SHAPE, **tiny_common(vocab_size))


def qwen3_moe(vocab_size: int):
    """Qwen3-MoE: 4 experts of width 48, 2 per token, top-k gates not renormalized (S ≠ 1 in Thm 11)."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                          head_dim=16, **SHAPE, **tiny_common(vocab_size))


def qwen3_next(vocab_size: int):
    """Qwen3-Next: gated DeltaNet (linear attention) in 3 layers of 4, attention in the 4th; an MoE with a
    shared expert behind a sigmoid gate."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(intermediate_size=128, moe_intermediate_size=48, shared_expert_intermediate_size=48,
                           num_experts=4, num_experts_per_tok=2, head_dim=16, linear_num_value_heads=4,
                           linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                           linear_conv_kernel_dim=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                           **SHAPE, **tiny_common(vocab_size))


def lfm2(vocab_size: int):
    """LFM2: short gated convolutions in layers 0 and 2, attention in 1 and 3; a SwiGLU (w1, w3, w2)."""
    from transformers import Lfm2Config

    return Lfm2Config(intermediate_size=128, block_auto_adjust_ff_dim=False,
                      layer_types=["conv", "full_attention"] * 2, **SHAPE, **tiny_common(vocab_size))


def gemma4_text(vocab_size: int, **change):
    """Gemma 4 (text), dense: Gemma 3's block with norms that scale by their weight, partial rotary on the
    full-attention layers; no per-layer inputs, no experts (`change` adds them)."""
    from transformers import Gemma4TextConfig

    keys = dict(intermediate_size=128, head_dim=16, global_head_dim=16, sliding_window=16,
                layer_types=["sliding_attention", "full_attention"] * 2, vocab_size_per_layer_input=vocab_size,
                hidden_size_per_layer_input=0, **SHAPE, **tiny_common(vocab_size))
    return Gemma4TextConfig(**dict(keys, **change))


def gemma4_text_moe(vocab_size: int):
    """Gemma 4's MoE sizes: 4 experts beside the dense MLP, reading their own norm of v."""
    return gemma4_text(vocab_size, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=48)


def gemma4_text_per_layer(vocab_size: int):
    """Gemma 4's small sizes: per-layer inputs of width 16 added after the MLP."""
    return gemma4_text(vocab_size, hidden_size_per_layer_input=16)


def gpt_oss(vocab_size: int):
    """gpt-oss: 4 experts of width 48 with biases, clamped SwiGLU, attention sinks."""
    from transformers import GptOssConfig

    return GptOssConfig(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                        sliding_window=16, **SHAPE, **tiny_common(vocab_size))


def gemma2(vocab_size: int):
    """Gemma 2: Gemma 3's block (pre- and post-MLP RMSNorm scaling by 1 + weight) with attention logits
    soft-capped (the default 50), which only eager attention runs; sliding-window and global layers."""
    from transformers import Gemma2Config

    return Gemma2Config(intermediate_size=128, head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                        **SHAPE, **tiny_common(vocab_size))


def falcon(vocab_size: int, **change):
    """Falcon (7B's block): a parallel block, attention and MLP both reading one LayerNorm of x, the attention
    named `self_attention`, rotary positions, no biases; `change` gives the 40B/180B block."""
    from transformers import FalconConfig

    keys = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=4096,
                new_decoder_architecture=False, parallel_attn=True, **tiny_common(vocab_size))
    return FalconConfig(**dict(keys, **change))


def falcon_new_decoder(vocab_size: int):
    """Falcon 40B/180B's block (`new_decoder_architecture`): parallel, two LayerNorms (one for attention, one for
    the MLP), grouped-query attention."""
    return falcon(vocab_size, new_decoder_architecture=True, num_kv_heads=2)


def opt(vocab_size: int):
    """OPT: pre-LayerNorm, no MLP module (`fc1`, `fc2` hang on the layer), ReLU, biases, learned absolute
    positions (offset 2), as OPT-125m and up."""
    from transformers import OPTConfig

    return OPTConfig(hidden_size=64, ffn_dim=128, word_embed_proj_dim=64, num_hidden_layers=4, num_attention_heads=4,
                     max_position_embeddings=4096, do_layer_norm_before=True, **tiny_common(vocab_size))


# model_type -> its written-out tiny config; name -> a variant's (a second size of a family)
WRITTEN = {"olmo3": olmo3, "qwen3_moe": qwen3_moe, "qwen3_next": qwen3_next, "lfm2": lfm2, "gemma4_text": gemma4_text,
           "gpt_oss": gpt_oss, "gemma2": gemma2, "falcon": falcon, "opt": opt}
VARIANTS = {"gemma4_text_moe": gemma4_text_moe, "gemma4_text_per_layer": gemma4_text_per_layer,
            "falcon_new_decoder": falcon_new_decoder}

# keys shrunk in a stock config, where it has them
SHRINK = dict(hidden_size=64, n_embd=64, d_model=64, intermediate_size=128, ffn_dim=128, n_inner=128,
              num_hidden_layers=4, n_layer=4, num_layers=4, num_attention_heads=4, n_head=4, num_heads=4,
              num_key_value_heads=2, head_dim=16, moe_intermediate_size=48, shared_expert_intermediate_size=48,
              num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, top_k_experts=2,
              max_position_embeddings=4096, n_positions=1024, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4)


def tiny_config(model_type: str, vocab_size: int):
    """`model_type`'s tiny config: written out above, or the stock config with its sizes shrunk (SHRINK; its
    `layer_types` cut to the first 4, each kind kept). Raises what transformers raises when it will not do."""
    if model_type in WRITTEN or model_type in VARIANTS:
        return {**WRITTEN, **VARIANTS}[model_type](vocab_size)
    from transformers import AutoConfig

    stock = AutoConfig.for_model(model_type)
    keys = {k: v for k, v in SHRINK.items() if k in stock.to_dict()}
    types_ = stock.to_dict().get("layer_types")
    if isinstance(types_, list) and types_:
        kinds = list(dict.fromkeys(types_))
        keys["layer_types"] = (kinds * 4)[:4]
    try:
        return type(stock)(**keys, **tiny_common(vocab_size))
    except Exception:  # a config that checks its keys against each other: sizes set after the fact
        for k, v in {**keys, **tiny_common(vocab_size)}.items():
            setattr(stock, k, v)
        return stock


def save_checkpoint(model_type: str, folder, seed: int = 0):
    """`model_type`'s tiny model (`tiny_config`) with random weights and the byte tokenizer, saved as a checkpoint
    folder that `model=FOLDER` loads like a user's: how the families without an adapter file enter a sweep
    (docs/goldwaser.md's Table 1). A variant name (gemma4_text_per_layer) saves its base family's model."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from experiments.core.atomic import save_pretrained
    from experiments.zoo.random_weights import randomize_
    from experiments.zoo.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(seed)
    model = randomize_(AutoModelForCausalLM.from_config(tiny_config(model_type, len(tok))), seed).eval()
    folder = Path(folder)
    save_pretrained(model, folder)  # the umask's mode, not transformers' 0600 safetensors
    save_pretrained(tok, folder)
    return folder


if __name__ == "__main__":  # python -m experiments.patching.arch.tiny DIR [NAME ...]: DIR/NAME for each
    import sys
    from pathlib import Path

    if len(sys.argv) < 2:
        sys.exit("usage: python -m experiments.patching.arch.tiny DIR [NAME ...] (default: every written-out family)")
    for name in sys.argv[2:] or [*WRITTEN, *VARIANTS]:
        print(save_checkpoint(name, Path(sys.argv[1]) / name))
