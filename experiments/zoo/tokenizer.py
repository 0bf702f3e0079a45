"""The offline tokenizer and Gemma's chat format, shared by every offline model and by GGUF conversion.

Offline models need a tokenizer that exists without the hub: one token per byte plus Gemma's special
tokens, built with the `tokenizers` library and wrapped as a transformers fast tokenizer, so it saves and
reloads with AutoTokenizer like a real one. CHAT_TEMPLATE is Gemma's chat format; a Gemma GGUF whose header
carries no template gets it too (zoo/gguf.py).
"""

from __future__ import annotations

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
