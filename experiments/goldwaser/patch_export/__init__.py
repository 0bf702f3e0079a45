"""patch_export — one prompt's context moved into a model's weights, saved as a stock checkpoint.

`icl-exp patch export model=... [prompt=...] [out=DIR]`: the context of one prompt moved into the
weights, written as a stock Hugging Face checkpoint into the run folder (RUN/patched, RUN/base for
random models, RUN/inputs.json).

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py (the registry finds run, validate and plot there by convention).
"""

from __future__ import annotations

from dataclasses import dataclass

from experiments.core.config_schema import Common
from experiments.core.registry import Experiment
from experiments.goldwaser.schema import MARS_PROMPT, PatchVariant


@dataclass
class PatchExportConfig(Common):
    """patch_export (`icl-exp patch export`)."""

    device: str = "cpu"
    model: str = "tiny-gemma3"  # hub id | local folder | offline model (see PatchMatch.model)
    # null: an open loop exact on the family (conditioned on Gemma 3 and OLMo 2, naive on Llama, Qwen, Mixtral,
    # GPT-J: evidence), the closed loop only where none is (GPT-2's learned positions: a construction)
    # | naive | stable | conditioned | closed_loop | closed_loop_scale
    variant: PatchVariant | None = None
    prompt: str = MARS_PROMPT
    chat_template: bool = True  # wrap the prompt in the model's chat template when it has one
    # the run folder (EXPERIMENT.run_dir_key: the CLI sets hydra.run.dir from it); null: results/patch_export/<stamp>
    out: str | None = None


EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="(checkpoint)",
    description="a prompt's context in the weights, saved as a stock transformers checkpoint",
    run_dir_key="out",  # out=DIR is the run folder
    draws_figures=False,
    schema=PatchExportConfig,
)
