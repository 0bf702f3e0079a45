"""The gpt_wq tokenizers as transformers fast tokenizers, so an exported checkpoint folder loads with
AutoTokenizer like any hub model (e.g. for patch_match). Built offline with the `tokenizers` library:
- gpt2: from the r50k_base ranks (transformers' TikTokenConverter), the same ids as tiktoken;
- bytes: token id = byte value (BPE without merges over the byte-level alphabet), 256 = <|endoftext|>.
"""

from __future__ import annotations

from pathlib import Path

EOT = "<|endoftext|>"


def hf_byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}  # id == byte value, as experiments.data.gpt2_bpe
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([EOT])  # id 256
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT, bos_token=EOT, unk_token=EOT)


def hf_gpt2_tokenizer(cache: Path):
    from tiktoken_ext.openai_public import r50k_pat_str
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from experiments.data.gpt2_bpe import gpt2_ranks

    backend = TikTokenConverter(vocab_file=str(gpt2_ranks(cache)), pattern=r50k_pat_str,
                                extra_special_tokens={EOT: 50256}).converted()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT, bos_token=EOT, unk_token=EOT)


def hf_tokenizer(name: str, cache: Path):
    return hf_gpt2_tokenizer(cache) if name == "gpt2" else hf_byte_tokenizer()
