"""OpenWebText for users with a network (data=openwebtext): HF `datasets` (the optional `[owt]` extra)
and the GPT-2 BPE, prepared once into the token cache with nanoGPT's split (0.05 % validation, seed 2357).
Hugging Face caches the download itself, so an interrupted preparation resumes from it."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np

from experiments.core.errors import UserError
from experiments.core.progress import progress
from experiments.data.gpt2_bpe import Tokenizer
from experiments.data.token_bins import write_bins_streamed

HUB_HOST = "huggingface.co"
DATASET = "Skylion007/openwebtext"  # the hub's OpenWebText (nanoGPT's "openwebtext" redirects here)


def hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((HUB_HOST, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def prepare_openwebtext(folder: Path, tok: Tokenizer, num_proc: int = 8) -> Path:
    try:
        import datasets
    except ImportError:
        raise UserError("data=openwebtext needs the `datasets` package: pip install 'icl-exp[owt]'") from None
    if not hub_reachable():
        raise UserError(f"data=openwebtext needs {HUB_HOST} (unreachable here): prepare it on a machine with a "
                        f"network and copy {folder} here, or use the offline corpus data=shakespeare")
    raw = datasets.load_dataset(DATASET, num_proc=num_proc)
    split = raw["train"].train_test_split(test_size=0.0005, seed=2357, shuffle=True)

    def encode(example):
        ids = tok.encode(example["text"]) + [tok.eot]
        return {"ids": ids, "len": len(ids)}

    tokenized = {name: ds.map(encode, remove_columns=["text"], desc=f"tokenizing {name}", num_proc=num_proc)
                 for name, ds in (("train", split["train"]), ("val", split["test"]))}

    def fill(name: str, out: np.memmap) -> None:
        ds, shards, at = tokenized[name], 1024, 0
        with progress(shards, f"writing {name}.bin") as bar:
            for i in range(shards):
                ids = np.concatenate(ds.shard(shards, i, contiguous=True).with_format("numpy")["ids"])
                out[at : at + len(ids)] = ids
                at += len(ids)
                bar.advance()

    sizes = {name: int(np.sum(ds["len"], dtype=np.uint64)) for name, ds in tokenized.items()}
    return write_bins_streamed(folder, sizes, fill, {"source": "openwebtext", "tokenizer": tok.name})
