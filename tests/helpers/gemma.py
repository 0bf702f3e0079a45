"""Shared helpers for the Gemma 3 tests: the offline tiny model, prompts, a with-context step."""

from __future__ import annotations

from functools import cache

import torch

from experiments.patching.load import load_checked
from experiments.zoo.bundle import ModelBundle
from experiments.zoo.prompts import encode_prompt

PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


@cache
def tiny(dtype: torch.dtype = torch.float32, name: str = "tiny-gemma3", seed: int = 0) -> ModelBundle:
    """Cached: tests must not modify its weights (one of them checks that patching doesn't)."""
    return load_checked(name, dtype, "cpu", seed=seed)


def prompt_inputs(bundle: ModelBundle, prompt: str = PROMPT) -> dict[str, torch.Tensor]:
    return encode_prompt(bundle, prompt, None, True, "cpu")


def state_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
