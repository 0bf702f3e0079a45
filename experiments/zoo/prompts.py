"""A user turn as model inputs, and where a reply ends: the chat template (and an image) applied the same
way for every architecture, so generation and patching see the same tokens."""

from __future__ import annotations

import torch

from experiments.core.errors import UserError
from experiments.zoo.bundle import ModelBundle


def encode_prompt(bundle: ModelBundle, prompt: str, image=None, chat_template: bool = True,
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


def stop_token_ids(bundle: ModelBundle) -> set[int]:
    """End of sequence and end of turn: where a chat reply stops."""
    tok, ids = bundle.tokenizer, set()
    for t in (tok.eos_token, "<end_of_turn>"):
        i = tok.convert_tokens_to_ids(t) if t else None
        if isinstance(i, int) and i != tok.unk_token_id:
            ids.add(i)
    eos = getattr(bundle.model.generation_config, "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids
