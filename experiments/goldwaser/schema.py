"""Typed schemas of Goldwaser et al.'s experiments: patch_match and gemma_match (gemma_match composes
patch_match's yaml and changes two values, so they share one), patch_export, layer_errors and
context_compile. The patch variants are an Enum, the rest typed, so `k=many` or `variant=fast` fails while
composing. What needs the model (its architecture, the variants it supports, k against its rank), the
prompts file and the names inside a list (dtypes=, variants=) stay in each experiment's validate().
Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

from experiments.core.config_schema import GROUP, experiment_schema
from experiments.goldwaser.system_compile.schema import SystemCompileConfig  # its own module


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


@dataclass
class PatchExport:
    model: str = MISSING
    variant: PatchVariant = MISSING
    prompt: str = MISSING
    chat_template: bool = MISSING
    out: str | None = MISSING  # the run folder (the CLI sets hydra.run.dir from it)


@dataclass
class LayerErrors:
    model: str = MISSING
    dtypes: list[str] = MISSING  # this experiment's own dtypes; layer_errors.validate names the choices
    variants: list[str] = MISSING  # likewise: naive | stable | closed_loop_scale | closed_loop
    prompts: list[str] = MISSING
    chat_template: bool = MISSING
    max_new_tokens: int = MISSING
    delta_rel: dict[str, float] = MISSING  # dtype -> |δ| / |x| of the input change measuring a layer's gain


@dataclass
class ContextCompile:
    model: str = MISSING
    prompt: str = MISSING
    prompts: Any = MISSING  # a list of prompts, or a text file with one prompt a line
    k: int = MISSING
    sweep: list[int] = MISSING
    heldout: int = MISSING
    margin: float = MISSING
    per_token: bool = MISSING
    save: bool = MISSING
    stop_at_eos: str = MISSING  # auto | true | false (a string node: `true` reads back as "True")
    chat_template: bool = MISSING


# Module attributes, so a composed config pickles (submitit sends it to the job).
PatchMatchConfig = experiment_schema(PatchMatch)
PatchExportConfig = experiment_schema(PatchExport)
LayerErrorsConfig = experiment_schema(LayerErrors)
ContextCompileConfig = experiment_schema(ContextCompile)

SCHEMAS = {"patch_match": PatchMatchConfig, "gemma_match": PatchMatchConfig, "patch_export": PatchExportConfig,
           "layer_errors": LayerErrorsConfig, "context_compile": ContextCompileConfig,
           "system_compile": SystemCompileConfig}


def register(store) -> None:
    for name, node in SCHEMAS.items():
        store.store(group=GROUP, name=name, node=node, package="_global_")
