"""Tokenizers for the GPT experiments: GPT-2's BPE (tiktoken's r50k_base) built offline, and a byte-level
tokenizer for tests.

tiktoken normally downloads r50k_base's ranks from a blob store that offline machines cannot reach. The
`openai-whisper` source distribution on PyPI ships the same file (whisper/assets/gpt2.tiktoken); its
SHA-256 is the one tiktoken pins for r50k_base, so an Encoding built from it is r50k_base, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.core.errors import UserError
from experiments.data.sdist import fetch_sdist, read_members

WHISPER_SDIST = "openai-whisper==20250625"
RANKS_MEMBER = "whisper/assets/gpt2.tiktoken"
# The hash tiktoken_ext.openai_public.r50k_base pins for r50k_base.tiktoken (checked in the tests).
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
TOKENIZERS = ("gpt2", "bytes")


@dataclass(frozen=True)
class Tokenizer:
    name: str
    n_vocab: int
    eot: int
    _encode: object
    _decode: object

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids) -> str:
        return self._decode(list(ids))


def gpt2_ranks(cache: Path) -> Path:
    """gpt2.tiktoken extracted from the whisper sdist into the cache, its hash checked against r50k_base."""
    import hashlib

    path = cache / "tokenizers" / "gpt2.tiktoken"
    if not path.is_file():
        archive = fetch_sdist(WHISPER_SDIST, cache / "sdists")
        members = read_members(archive, lambda n: n.endswith(RANKS_MEMBER))
        if not members:
            raise UserError(f"{archive.name} holds no {RANKS_MEMBER}")
        data = next(iter(members.values()))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != R50K_SHA256:
        raise UserError(f"{path} is not GPT-2's r50k_base ranks (sha256 {digest[:12]}...); delete it to re-fetch")
    return path


def gpt2_tokenizer(cache: Path) -> Tokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str

    ranks = load_tiktoken_bpe(str(gpt2_ranks(cache)), expected_hash=R50K_SHA256)
    enc = tiktoken.Encoding(name="r50k_base", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                            special_tokens={ENDOFTEXT: 50256}, explicit_n_vocab=50257)
    return Tokenizer("gpt2", enc.n_vocab, enc.eot_token, enc.encode_ordinary, enc.decode)


def byte_tokenizer() -> Tokenizer:
    """UTF-8 bytes as ids 0..255 and 256 as end of text: no download, for tests and CI."""
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    return Tokenizer("bytes", 257, 256, encode, decode)


def get_tokenizer(name: str, cache: Path) -> Tokenizer:
    if name == "gpt2":
        return gpt2_tokenizer(cache)
    if name == "bytes":
        return byte_tokenizer()
    raise UserError(f"tokenizer={name!r} is not one of {', '.join(TOKENIZERS)}")


def vocab_size_of(name: str) -> int:
    return {"gpt2": 50257, "bytes": 257}[name]


def encode_documents(docs: list[str], tok: Tokenizer) -> np.ndarray:
    """nanoGPT's convention: each document's ids followed by the end-of-text token, concatenated, uint16."""
    ids: list[int] = []
    for doc in docs:
        ids.extend(tok.encode(doc))
        ids.append(tok.eot)
    return np.asarray(ids, dtype=np.uint16)
