"""model=qwen2.5-0.5b: the registry's trained Qwen2.5-Coder-0.5B-Instruct, joined, checked, converted once and
loaded offline (conftest's session fixture `qwen32`). It is a trained instruction model with its own chat
template: it answers, and a system prompt changes how."""

from __future__ import annotations

import torch

from experiments.zoo.bundled_gguf import QWEN_05B, joined_gguf
from experiments.zoo.gguf_metadata import read_metadata


def next_token(bundle, messages) -> str:
    ids = bundle.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
    with torch.no_grad():
        logits = bundle.model(**ids).logits[0, -1]
    return bundle.tokenizer.decode(int(logits.argmax()))


def test_it_is_the_qwen2_block_of_the_issue(qwen32):
    c = qwen32.model.config
    assert not qwen32.is_random and type(qwen32.model).__name__ == "Qwen2ForCausalLM"
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.intermediate_size) == ("qwen2", 24, 896, 4864)
    assert (c.num_attention_heads, c.num_key_value_heads) == (14, 2)
    assert qwen32.model.dtype == torch.float32


def test_the_chat_template_is_the_ggufs_own(qwen32):
    """transformers' GGUF tokenizer drops `tokenizer.chat_template`; the conversion puts it back: the loaded
    tokenizer's template is the one read from the GGUF's header here."""
    gguf_template = read_metadata(joined_gguf(QWEN_05B, progress=lambda _l: None), QWEN_05B.name).chat_template
    assert gguf_template and "<|im_start|>" in gguf_template
    assert qwen32.tokenizer.chat_template == gguf_template


def test_it_answers_and_follows_a_system_prompt(qwen32):
    assert next_token(qwen32, [{"role": "user", "content": "What is 2 + 3? Answer with the digit only."}]) == "5"
    hello = [{"role": "user", "content": "Say hello to my friend."}]
    french = [{"role": "system", "content": "Always answer in French."}, *hello]
    assert next_token(qwen32, hello).strip() == "Hello"  # the control: without the system prompt, English
    assert next_token(qwen32, french).strip().startswith("Bon")
