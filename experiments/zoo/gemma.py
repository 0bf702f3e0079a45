"""The offline Gemma 3 models: random weights in Gemma 3's shapes, built without the hub.

- `tiny-gemma3`: a small seeded random Gemma3ForCausalLM with the byte-level tokenizer;
- `gemma3-1b-random`: the real Gemma 3 1B shape (26 layers, d=1152, GeGLU 6912, vocab 262144) with
  random weights, for the speed/memory benchmark;
- `tiny-gemma3-vision`: a small random Gemma3ForConditionalGeneration (SigLIP tower + projector) with a
  Gemma3Processor around the same byte-level tokenizer, for the image-context test.
tiny-gemma3's config is written here, beside the other two, and Gemma's adapter carries it as its tiny model
(patching/arch/gemma3.py); the other families' tiny configs sit beside their adapters, and reach the loader
through patching's catalog (zoo/catalog.py).
"""

from __future__ import annotations

import torch

from experiments.core.errors import UserError
from experiments.zoo.random_weights import randomize_
from experiments.zoo.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, byte_tokenizer

RANDOM_GEMMA_MODELS = ("tiny-gemma3", "gemma3-1b-random", "tiny-gemma3-vision")


def tiny_text_config(vocab_size: int):
    """tiny-gemma3: 4 layers alternating sliding-window (window 16) and global attention, GQA 4:2, GeGLU 128."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=16, sliding_window_pattern=2, max_position_embeddings=4096,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
        # Untied: with a tied output a random model's top token is the query token itself, forever.
        tie_word_embeddings=False,
    )


def gemma3_1b_config():
    """google/gemma-3-1b-it's config.json, typed out (the checkpoint is gated; the shape is public)."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=512, sliding_window_pattern=6, max_position_embeddings=32768,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=[1, 106], bos_token_id=2,
    )


def tiny_vision_config(vocab_size: int):
    """Gemma3Config with the tiny text model, a 2-layer SigLIP tower on 32×32 images, 4 image tokens."""
    from transformers import Gemma3Config, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=2, image_size=32, patch_size=8)
    ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    return Gemma3Config(text_config=tiny_text_config(vocab_size).to_dict(), vision_config=vision.to_dict(),
                        mm_tokens_per_image=4, boi_token_index=ids["<start_of_image>"],
                        eoi_token_index=ids["<end_of_image>"], image_token_index=ids["<image_soft_token>"])


def _random_causal_lm(config, seed: int):
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(seed)
    return randomize_(Gemma3ForCausalLM(config), seed)


def _tiny_processor(tokenizer):
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    # the PIL backend: torchvision is not a dependency
    image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32}, do_pan_and_scan=False)
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                           image_seq_length=4)


def build_offline(name: str, seed: int):
    """(model, tokenizer, processor) of one of RANDOM_GEMMA_MODELS, in float32."""
    tok = byte_tokenizer()
    if name == "tiny-gemma3":
        return _random_causal_lm(tiny_text_config(len(tok)), seed), tok, None
    if name == "gemma3-1b-random":
        return _random_causal_lm(gemma3_1b_config(), seed), tok, None
    if name == "tiny-gemma3-vision":
        from transformers import Gemma3ForConditionalGeneration

        torch.manual_seed(seed)
        model = randomize_(Gemma3ForConditionalGeneration(tiny_vision_config(len(tok))), seed)
        return model, tok, _tiny_processor(tok)
    raise UserError(f"unknown offline model {name!r}; known: {', '.join(RANDOM_GEMMA_MODELS)}")
