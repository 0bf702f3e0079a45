"""nanoGPT's data convention: token ids in uint16 `train.bin` / `val.bin`, read through np.memmap; training
batches are random windows of block_size + 1 tokens; validation uses fixed, seeded windows, so every
variant (and every resumed run) is scored on the same tokens.

A prepared folder is keyed by source and tokenizer (`<cache>/tokens/<source>-<tokenizer>/`) and written
to a temporary folder first, then renamed: a half-written preparation is never mistaken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from experiments.core.errors import UserError

META = "meta.json"


def split_documents(docs: dict[str, str], val_fraction: float) -> tuple[list[str], list[str]]:
    """The last val_fraction of every document (cut at a line break) is validation text: the split is
    proportional whatever the documents' sizes, and every work is represented on both sides."""
    train, val = [], []
    for name in sorted(docs):
        text = docs[name]
        cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction))) + 1 or int(len(text) * (1 - val_fraction))
        train.append(text[:cut])
        val.append(text[cut:])
    return train, val


def text_key(docs: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(docs):
        h.update(name.encode())
        h.update(docs[name].encode())
    return h.hexdigest()[:12]


def write_bins(folder: Path, train: np.ndarray, val: np.ndarray, meta: dict) -> Path:
    """train.bin, val.bin and meta.json into `folder`, atomically (temp folder, then rename)."""
    arrays = {"train": train, "val": val}
    return write_bins_streamed(folder, {k: len(v) for k, v in arrays.items()},
                               lambda name, out: out.__setitem__(slice(None), arrays[name]), meta)


def write_bins_streamed(folder: Path, sizes: dict[str, int], fill, meta: dict) -> Path:
    """Like write_bins for data too large for memory: `fill(split, memmap)` writes each split in place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for split in ("train", "val"):
        out = np.memmap(tmp / f"{split}.bin", dtype=np.uint16, mode="w+", shape=(sizes[split],))
        fill(split, out)
        out.flush()
        del out
    meta = {**meta, "train_tokens": int(sizes["train"]), "val_tokens": int(sizes["val"])}
    (tmp / META).write_text(json.dumps(meta, indent=1))
    if folder.exists():  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(folder)
    return folder


def is_prepared(folder: Path) -> bool:
    return all((folder / n).is_file() for n in ("train.bin", "val.bin", META))


def load_bins(folder: Path) -> tuple[np.memmap, np.memmap, dict]:
    meta = json.loads((folder / META).read_text())
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r")
    return train, val, meta


def fixed_windows(n_tokens: int, block_size: int, count: int, seed: int) -> np.ndarray:
    """`count` window starts in a token array, the same for every run with this seed."""
    if n_tokens < block_size + 1:
        raise UserError(f"the validation split holds {n_tokens} tokens, fewer than block_size + 1 = {block_size + 1}")
    rng = np.random.default_rng(seed)
    return np.sort(rng.integers(0, n_tokens - block_size, size=count))


def windows_to_batch(data: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = np.stack([np.asarray(data[s : s + block_size + 1], dtype=np.int64) for s in starts])
    chunks = torch.from_numpy(chunks)
    return chunks[:, :-1], chunks[:, 1:]


def random_batch(data: np.ndarray, block_size: int, batch_size: int, seed: int, step: int,
                 micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of (step, global micro-batch index): a pure function of its arguments, so a
    resumed run sees exactly the batches the uninterrupted run would have, and N ranks with A accumulation
    steps each see the batches one process with N·A accumulation steps would."""
    if len(data) < block_size + 1:
        raise UserError(f"the training split holds {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}")
    rng = np.random.default_rng([seed, step, micro])
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    return windows_to_batch(data, starts, block_size)
