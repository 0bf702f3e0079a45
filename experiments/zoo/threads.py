"""CPU threads for the model at hand: small models run faster on one thread than on several."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

SMALL_MODEL_PARAMS = 50_000_000


@contextmanager
def threads_for(model: nn.Module) -> Iterator[None]:
    """One CPU thread for small models: on them a parallel region costs more than the work (a 64-wide
    matmul is orders of magnitude slower with 2 threads than with 1 on a 2-core machine)."""
    n_params = sum(p.numel() for p in model.parameters())
    before = torch.get_num_threads()
    if n_params < SMALL_MODEL_PARAMS and next(model.parameters()).device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
