"""patch_match: Goldwaser et al. §4–5, Figs. 3–5 on any supported architecture, and Table 1 as a picture.

Goldwaser et al. §4–5 (Figs. 3–4, Table 1) on any supported decoder: the model without context,
patched per token by Table 1's rules, against the model with the context.
A sweep over the families' tiny random models gives Table 1 as a picture (the paper's 8 prompts, 30 tokens;
a random model has no notion of a reply's end):
  icl-exp run patch_match -m model=$(python -m experiments.patching.families --tiny) \
      dtype=float32,bfloat16 variant=naive,closed_loop max_new_tokens=30 stop_at_eos=false
(the families module prints every tiny model, comma-separated: tiny-gemma3,tiny-llama,...)

Its home: the config class (every key, its type, its paper default and what it means), what each preset
changes, and the declaration; torch-free, so that `icl-exp list` and a composition import nothing heavy.
What it does is run.py, claims.py and plots.py (run, validate and plot, found by convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from experiments.core.config_schema import Common, default
from experiments.core.registry import Experiment
from experiments.goldwaser.schema import MARS_PROMPT, PatchApply, PatchVariant
from experiments.patching.kinds import ADVANCE_MODES

# experiments/patching/kinds.py's ADVANCE_MODES, in its order: the one list of names (torch-free)
TextAdvance = StrEnum("TextAdvance", {name: name for name in ADVANCE_MODES})


class Sampling(StrEnum):
    """patch_match's `sampling=`: how the next token is chosen."""

    greedy = "greedy"
    sample = "sample"  # seeded; the with-context and the patched model draw with the same random state


class StockCheck(StrEnum):
    """patch_match's `stock_check=`: when the closed loop's patched weights also run as stock weights
    (patch_match.STOCK_CHECK says what each does, `auto` is patch_match.stock_check's choice)."""

    auto = "auto"
    first = "first"
    all = "all"
    none = "none"


@dataclass
class PatchMatchConfig(Common):
    """patch_match (§4–5, Figs. 3–4, Table 1)."""

    # hub id | local folder | PATH.gguf | offline: gemma-3-270m, qwen2.5-0.5b (real, trained), each family's
    # tiny-<family> (random: docs/models.md's families table), gemma3-1b-random, llama3.2-1b-random
    model: str = "meta-llama/Llama-3.2-1B-Instruct"
    # the paper's open loop, whose agreement is evidence: naive (Alg. 1) | stable (App. B) | conditioned (W_down to
    # C·sign(d_C): Eq. 4 divides by ±1); stable and conditioned need a post-MLP norm (Gemma 3, OLMo 2).
    # A construction, exact by design (its last-layer control runs beside it): closed_loop | closed_loop_scale
    variant: PatchVariant = PatchVariant.naive
    # how a matrix's rank-1 patch reaches the forward: materialized (W + ΔW rounded to the model's dtype, the
    # paper's weight update) | action (W·z + c (vᵀz) in the model's dtype, W untouched; open loop, no MoE)
    apply: PatchApply = PatchApply.materialized
    # the token the text goes on with: context (the with-context model's, §4.1) | patched (the patched model's own)
    advance: TextAdvance = TextAdvance.context
    prompt: str = MARS_PROMPT
    # More generations for Fig. 4: a list, or a text file path with one prompt a line.
    prompts: Any = default([
        "Write a haiku about the first snow of winter.",
        "Explain in two sentences why the sky is blue.",
        "Give three tips for keeping a sourdough starter alive.",
        "Write a limerick about a cat who learns to code.",
        "Summarize the plot of Romeo and Juliet in one sentence.",
        "Describe the taste of coffee to someone who has never had it.",
        "Write a short motivational message for a student before an exam.",
    ])
    chat_template: bool = True  # wrap each prompt in the model's chat template when it has one
    image: str | None = None  # an image in the context (multimodal Gemma 3 only), or "synthetic"
    max_new_tokens: int = 100
    sampling: Sampling = Sampling.greedy  # greedy | sample (seeded; both models sample with the same random state)
    temperature: float = 1.0
    stop_at_eos: bool = True  # stop a reply at end of sequence / end of turn
    # closed loop only (an open loop's patched pass is the stock forward itself; refused there): also run the
    # patched weights as stock weights (the model's own parameters, no hooks): all tokens | first token of each
    # prompt | none | auto: all on models up to 50M parameters, first above
    stock_check: StockCheck = StockCheck.auto
    control: bool = True  # also run the unpatched model without context (the control)


# What each preset changes: only the keys that differ from the paper's defaults above.
PRESETS = {
    # preset=smoke: seconds, for tests and CI.
    "smoke": {
        "model": "tiny-llama",
        "prompts": [
            "Hi.",
        ],
        "max_new_tokens": 6,
        "stop_at_eos": False,
    },
    # preset=cpu: minutes on 2 cores, offline, on trained weights: the real Qwen2.5-Coder-0.5B-Instruct (qwen2:
    # Table 1's outer-weight rule, W_down absorbs r, Thm 9), the Fig. 3 prompt and a coding one, 12 tokens each
    # (naive float32: 48/48 top-1 at 16 tokens x 3 prompts, 4 min of CPU time; a token costs ~5 s of CPU).
    # The tiny random models of every family stay for preset=smoke and the Table 1 sweep (this package's docstring).
    "cpu": {
        "model": "qwen2.5-0.5b",
        "prompts": [
            "Write a Python function that returns the n-th Fibonacci number.",
        ],
        "max_new_tokens": 12,
    },
}

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="Figs. 3–4, Table 1",
    description="any supported decoder without context, patched per token (Table 1 rules), vs with context",
    schema=PatchMatchConfig,
    presets=PRESETS,
)
