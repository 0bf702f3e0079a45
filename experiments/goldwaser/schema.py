"""Typed schema of patch_match and gemma_match (gemma_match composes patch_match's yaml and changes
two values, so they share it): the patch variants as an Enum, the generation keys typed. Which
variant a model supports, the model itself and the prompts file stay in patch_match.validate.
Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from experiments.core.config_schema import GROUP, experiment_schema


class PatchVariant(StrEnum):
    """experiments/patching/arch's VARIANTS, in its order (tests/goldwaser/test_goldwaser_schema.py
    keeps them equal)."""

    naive = "naive"
    stable = "stable"
    conditioned = "conditioned"
    closed_loop = "closed_loop"
    closed_loop_scale = "closed_loop_scale"


@dataclass
class PatchMatch:
    model: str = MISSING  # hub id | local folder | PATH.gguf | an offline model's name
    variant: PatchVariant = MISSING
    prompt: str = MISSING
    prompts: Any = MISSING  # a list of prompts, or a text file with one prompt a line
    chat_template: bool = MISSING
    image: str | None = MISSING
    max_new_tokens: int = MISSING
    sampling: str = MISSING  # greedy | sample (patch_match.validate names them)
    temperature: float = MISSING
    stop_at_eos: bool = MISSING
    stock_check: str = MISSING  # first | all | none (patch_match.validate names them)
    control: bool = MISSING


PatchMatchConfig = experiment_schema(PatchMatch)  # a module attribute, so a composed config pickles


def register(store) -> None:
    for name in ("patch_match", "gemma_match"):
        store.store(group=GROUP, name=name, node=PatchMatchConfig, package="_global_")
