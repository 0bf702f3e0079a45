"""context_compile: a prompt compiled once into fixed weights, and how far that carries (beyond the papers).

Beyond the papers (Goldwaser §6's open question): ONE weight change per layer, fitted at the first k
positions of the model's own reply to a prompt, stands in for the prompt; measured on the positions after.
  icl-exp run context_compile model=gemma-3-270m preset=cpu
  icl-exp patch compile model=gemma-3-270m prompt="..." k=16 out=DIR   (writes a stock checkpoint in DIR)

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py, claims.py and plots.py (run, validate and plot, found by convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experiments.core.config_schema import Common, default
from experiments.core.registry import Experiment


@dataclass
class ContextCompileConfig(Common):
    """context_compile (beyond the papers, Goldwaser §6's open question)."""

    device: str = "cpu"
    # hub id | local folder | offline: gemma-3-270m, qwen2.5-0.5b (real), each family's tiny-<family> (random:
    # docs/models.md's families table). gemma-3-270m is a base model: it continues text (with its chat template
    # it repeats the prompt), so the prompts are openings to continue and chat_template is false; for an
    # instruction-tuned model set it true.
    model: str = "gemma-3-270m"
    prompt: str = "The lighthouse keeper found a message in a bottle. It said:"
    # more prompts for the sweep (a list, or a text file with one prompt a line)
    prompts: Any = default([
        "Octopuses are considered intelligent animals because",
        "Here is a recipe for pancakes.\n\nIngredients:",
        "The Moon has phases because",
        "A bicycle's gears work by",
        "Honeybees spend their day",
        "Bread dough rises because",
        "The three primary colours are",
    ])
    k: int = 16  # positions the checkpoint's fixed patch is fitted at (≤ the hidden size)
    sweep: list[int] = default([1, 4, 16, 64])  # further k measured (the figure: one line each)
    heldout: int = 32  # positions after the k fitted ones that are measured as held out
    margin: float = 0.1  # claim: held-out top-1 agreement above the control's by at least this fraction
    per_token: bool = True  # also the per-token patch (Algorithm 1, closed loop): the upper bound
    save: bool = True  # save the k= patch of the first prompt as a stock checkpoint in the run folder
    # end a reply at end of turn: auto = trained models only | true | false (a string node: `true` reads back
    # as "True")
    stop_at_eos: str = "auto"
    chat_template: bool = False  # true: wrap each prompt in the model's chat template (instruction-tuned models)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # preset=smoke: seconds, for tests and CI.
    "smoke": {
        "model": "tiny-llama",
        "prompts": [],
        "k": 4,
        "sweep": [1, 4],
        "heldout": 4,
    },
    # preset=cpu: minutes on 2 cores, offline: 2 prompts (3 took 203 s in reproduce on the shared machine), the full
    # k sweep (any model= works: tiny-llama, ...).
    "cpu": {
        "prompts": [
            "Octopuses are considered intelligent animals because",
        ],
    },
}

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="(extension §6)",
    description="one fixed weight change fitted at k positions stands in for a prompt: how far it carries",
    schema=ContextCompileConfig,
    presets=PRESETS,
)
