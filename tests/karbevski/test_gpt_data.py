"""Data for gpt_wq: nanoGPT's uint16 bins, fixed validation windows, deterministic batches, tokenizers."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from experiments.core.errors import UserError
from experiments.data.corpus import FIXTURE, prepare, prepared_folder, read_text_file
from experiments.data.gpt2_bpe import R50K_SHA256, byte_tokenizer, encode_documents, gpt2_tokenizer
from experiments.data.token_bins import fixed_windows, load_bins, random_batch, split_documents


def test_pinned_hash_is_tiktokens_r50k_base():
    from tiktoken_ext import openai_public

    assert R50K_SHA256 in inspect.getsource(openai_public.r50k_base)
    assert R50K_SHA256 not in inspect.getsource(openai_public.p50k_base)  # control: another encoding's pin


def test_byte_tokenizer_and_document_convention():
    tok = byte_tokenizer()
    ids = encode_documents(["ab", "é"], tok)
    assert ids.dtype == np.uint16
    assert ids.tolist() == [97, 98, 256, 0xC3, 0xA9, 256]
    assert tok.decode(ids[:2]) == "ab"


def test_split_is_proportional_and_keeps_every_document():
    docs = {"a": "line\n" * 100, "b": "x\n" * 1000}
    train, val = split_documents(docs, 0.1)
    assert [t + v for t, v in zip(train, val, strict=True)] == [docs["a"], docs["b"]]
    for t, v in zip(train, val, strict=True):
        assert 0.05 < len(v) / (len(t) + len(v)) < 0.15


def test_prepare_fixture_writes_bins_once(tmp_path):
    folder = prepare("fixture", "bytes", tmp_path)
    train, val, meta = load_bins(folder)
    text = "".join(read_text_file(str(FIXTURE)).values())
    assert len(train) + len(val) == len(text.encode()) + 2 * meta["documents"]  # + end-of-text after each part
    assert train.dtype == np.uint16 and meta["tokenizer"] == "bytes"
    stamp = (folder / "train.bin").stat().st_mtime_ns
    assert prepare("fixture", "bytes", tmp_path) == folder and (folder / "train.bin").stat().st_mtime_ns == stamp
    # keyed by tokenizer and by text
    assert prepared_folder("fixture", "gpt2", tmp_path) != folder
    other = tmp_path / "other.txt"
    other.write_text("something else\n")
    assert prepared_folder("text_file", "bytes", tmp_path, str(other)) != folder


def test_missing_text_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match="text_file="):
        prepare("text_file", "bytes", tmp_path, str(tmp_path / "nope.txt"))
    with pytest.raises(UserError, match="is not one of"):
        prepare("wikipedia", "bytes", tmp_path)


def test_windows_and_batches_are_seeded():
    data = np.arange(1000, dtype=np.uint16)
    assert (fixed_windows(1000, 16, 8, seed=3) == fixed_windows(1000, 16, 8, seed=3)).all()
    assert (fixed_windows(1000, 16, 8, seed=3) != fixed_windows(1000, 16, 8, seed=4)).any()
    x, y = random_batch(data, 16, 4, seed=0, step=5, micro=1)
    x2, _ = random_batch(data, 16, 4, seed=0, step=5, micro=1)
    assert (x == x2).all() and (y == x + 1).all() and x.shape == (4, 16)
    assert (random_batch(data, 16, 4, seed=0, step=5, micro=2)[0] != x).any()
    with pytest.raises(UserError, match="fewer than block_size"):
        fixed_windows(10, 16, 2, seed=0)


@pytest.mark.slow  # downloads the openai-whisper sdist (~0.8 MB) from PyPI on first use
def test_gpt2_bpe_built_offline_is_gpt2(tmp_path):
    tok = gpt2_tokenizer(tmp_path)
    assert tok.n_vocab == 50257 and tok.eot == 50256
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's well-known ids
    assert tok.decode(tok.encode("To be, or not to be")) == "To be, or not to be"
