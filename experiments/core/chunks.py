"""Evaluate in slices of a batch: a memory knob, nothing else."""

from __future__ import annotations

from collections.abc import Callable

import torch


def in_chunks(fn: Callable[[torch.Tensor], dict[str, torch.Tensor]], tokens: torch.Tensor,
              chunk: int) -> dict[str, torch.Tensor]:
    """fn over batches of at most `chunk` prompts, results concatenated along the batch."""
    parts = [fn(tokens[i:i + chunk]) for i in range(0, len(tokens), chunk)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
