"""Gemma 3 models for gemma_match: the real checkpoints, and offline random stand-ins.

`load_gemma(name, dtype, device, seed)` takes
- a hub id (`google/gemma-3-1b-it`, `google/gemma-3-4b-it`) or a local checkpoint folder, loaded with
  transformers' `from_pretrained` (text-only `gemma3_text` checkpoints as Gemma3ForCausalLM, the
  multimodal `gemma3` ones as Gemma3ForConditionalGeneration with their processor);
- `tiny-gemma3`: a small seeded random Gemma3ForCausalLM with a byte-level tokenizer built here;
- `gemma3-1b-random`: the real Gemma 3 1B shape (26 layers, d=1152, GeGLU 6912, vocab 262144) with
  random weights, for the speed/memory benchmark;
- `tiny-gemma3-vision`: a small random Gemma3ForConditionalGeneration (SigLIP tower + projector)
  with a Gemma3Processor around the same byte-level tokenizer, for the image-context test.

Random models re-draw every weight from a seeded generator so that a run is reproducible and so
that the RMSNorm scales m = 1 + weight are not all 1 (the stable patch inverts them). Weights are
scaled by 1/√fan_in, which gives logits with a spread like a trained model's (not a near-uniform
distribution on which every bfloat16 rounding would flip the top token).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from experiments.core.errors import UserError
from experiments.patching.arch.gemma3 import tiny_config as tiny_text_config  # beside its adapter

EMBED_STD = 0.4  # logits of the tied output layer then spread by a few units, like a trained model's
SMALL_MODEL_PARAMS = 50_000_000
OFFLINE_MODELS = ("tiny-gemma3", "gemma3-1b-random", "tiny-gemma3-vision")
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                  "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
# Gemma's chat format: turns between <start_of_turn>ROLE and <end_of_turn>; the reply starts after
# "<start_of_turn>model\n".
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] | trim }}"
    "{% else %}{% for part in m['content'] %}{% if part['type'] == 'image' %}<start_of_image>"
    "{% else %}{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
@dataclass
class GemmaBundle:
    """A loaded model and what turns text (and images) into its inputs."""

    name: str
    model: nn.Module  # Gemma3ForCausalLM or Gemma3ForConditionalGeneration, eval mode
    tokenizer: object  # a transformers tokenizer
    processor: object | None = None  # Gemma3Processor for multimodal models
    is_random: bool = False  # built here (exported next to a patched copy as DIR/base)

    @property
    def multimodal(self) -> bool:
        return self.processor is not None


# -- the byte-level tokenizer ----------------------------------------------------------------------
def byte_tokenizer():
    """A tokenizer with Gemma's special tokens and one token per byte (BPE without merges).

    Built offline with the `tokenizers` library, wrapped as a transformers fast tokenizer, so it saves
    and reloads with AutoTokenizer like a real one and has Gemma's chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


# -- configs ---------------------------------------------------------------------------------------
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


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Redraw every weight from a seeded generator: matrices and convolutions N(0, 1/fan_in); token
    and position embeddings and the output layer N(0, EMBED_STD²); Gemma's RMSNorm
    weights N(0, 0.3²), so that its scales m = 1 + w vary; LayerNorm weights 1 + N(0, 0.1²); biases 0."""
    gen = torch.Generator().manual_seed(seed)

    def draw(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float32) * std + mean).to(p.dtype))

    seen: set[int] = set()  # tied weights (lm_head = embed_tokens) are drawn once, as embeddings
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, nn.Embedding) or module is getattr(model, "lm_head", None):
                draw(p, EMBED_STD)
            elif isinstance(module, nn.LayerNorm):
                draw(p, 0.1, 1.0) if pname == "weight" else p.zero_()
            elif pname == "bias":
                p.zero_()
            elif p.ndim >= 2:
                draw(p, 1.0 / math.sqrt(_fan_in(module, p)))
            elif "Gemma" in type(module).__name__:  # Gemma3RMSNorm weights (scale 1 + w)
                draw(p, 0.3)
            else:  # RMSNorm weights that are the scale itself (Llama, Mixtral)
                draw(p, 0.3, 1.0)
    return model


def _fan_in(module: nn.Module, p: torch.Tensor) -> int:
    """Inputs per output: GPT-2's Conv1D stores (in, out); an MoE's stacked experts (E, out, in)."""
    if type(module).__name__ == "Conv1D":
        return p.shape[0]
    if p.ndim == 3 and not isinstance(module, nn.Conv1d):
        return p.shape[-1]
    return p[0].numel()


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
    """(model, tokenizer, processor) of one of OFFLINE_MODELS, in float32."""
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
    raise UserError(f"unknown offline model {name!r}; known: {', '.join(OFFLINE_MODELS)}")


# -- loading ---------------------------------------------------------------------------------------
def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:200]


def load_gemma(name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               seed: int = 0) -> GemmaBundle:
    """The model `name` in `dtype` on `device`, in eval mode: `patch_models.load_model`, which also takes
    the other architectures (kept under this name for gemma_match's callers)."""
    from experiments.goldwaser.patch_models import load_model

    return load_model(name, dtype, device, seed)


# -- inputs ----------------------------------------------------------------------------------------
def synthetic_image(seed: int = 0, size: int = 64):
    """A seeded RGB test image (smooth gradients plus noise) for offline image-context runs."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    rgb = np.stack([xx, yy, 0.5 * (xx + yy)], axis=-1) + 0.2 * rng.standard_normal((size, size, 3))
    return Image.fromarray((255 * np.clip(rgb, 0, 1)).astype("uint8"))


def load_image(spec: str, seed: int = 0):
    """`image=PATH` (any format PIL opens) or `image=synthetic`."""
    from PIL import Image

    if str(spec) == "synthetic":
        return synthetic_image(seed)
    path = Path(str(spec)).expanduser()
    try:
        return Image.open(path).convert("RGB")
    except Exception as err:
        raise UserError(f"cannot read image={spec!r}: {_first_line(err)}") from None


def encode_prompt(bundle: GemmaBundle, prompt: str, image=None, chat_template: bool = True,
                  device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Model inputs for one user turn: the chat template when the tokenizer has one (and `chat_template`),
    the image (if any) placed before the text as Gemma 3's processor expects."""
    tok = bundle.tokenizer
    if image is not None and not bundle.multimodal:
        raise UserError(f"image=... needs a multimodal Gemma 3 (e.g. model=google/gemma-3-4b-it or "
                        f"model=tiny-gemma3-vision); {bundle.name} is text-only")
    content = [{"type": "image"}, {"type": "text", "text": prompt}] if image is not None else prompt
    use_template = chat_template and getattr(tok, "chat_template", None)
    if bundle.multimodal:
        messages = [{"role": "user", "content": content if image is not None else [{"type": "text", "text": prompt}]}]
        if use_template:
            text = bundle.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = (f"{tok.bos_token}{bundle.processor.boi_token} " if image is not None else tok.bos_token) + prompt
        inputs = bundle.processor(text=text, images=[image] if image is not None else None, return_tensors="pt",
                                  add_special_tokens=False)
    else:
        if use_template:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
        else:
            text = (tok.bos_token or "") + prompt
        inputs = tok(text, return_tensors="pt", add_special_tokens=False)
    keep = ("input_ids", "attention_mask", "pixel_values", "token_type_ids")
    return {k: v.to(device) for k, v in inputs.items() if k in keep}


def stop_token_ids(bundle: GemmaBundle) -> set[int]:
    """End of sequence and end of turn: where a chat reply stops."""
    tok, ids = bundle.tokenizer, set()
    for t in (tok.eos_token, "<end_of_turn>"):
        i = tok.convert_tokens_to_ids(t) if t else None
        if isinstance(i, int) and i != tok.unk_token_id:
            ids.add(i)
    eos = getattr(bundle.model.generation_config, "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids


@contextmanager
def threads_for(model: nn.Module) -> Iterator[None]:
    """One CPU thread for small models: on them a parallel region costs more than the work (a 64-wide
    matmul measured 20 ms with 2 threads against 0.02 ms with 1 on the 2-core CI machine)."""
    n_params = sum(p.numel() for p in model.parameters())
    before = torch.get_num_threads()
    if n_params < SMALL_MODEL_PARAMS and next(model.parameters()).device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
