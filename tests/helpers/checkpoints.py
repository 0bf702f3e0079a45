"""Tiny random models saved as a user's checkpoint folders (weights + the byte tokenizer), for tests that run
the CLI on a local folder the way a user's own checkpoint is run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from experiments.zoo.tokenizer import byte_tokenizer


def checkpoint_folders(root: Path, names: Iterable[str], build: Callable[[str, int], object]) -> dict[str, Path]:
    """root/<name> for each name: `build(name, vocab_size)`'s model saved beside the byte tokenizer."""
    tok = byte_tokenizer()
    out = {}
    for name in names:
        build(name, len(tok)).save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = root / name
    return out
