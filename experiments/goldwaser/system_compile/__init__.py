"""system_compile: a system prompt compiled into the weights, the analytic fixed patch against prompt baking
(a LoRA trained on the KL), measured on user queries neither was fitted on. See run.py.

Beyond the papers: a SYSTEM prompt compiled once into the weights, then applied to user queries it was never
fitted on: Table 1's analytic fixed patch (least squares over the fit queries' positions) against prompt
baking (a peft LoRA trained on KL(prompted ‖ unprompted + LoRA)), beside the unprompted model (control)
and the prompted one (reference). docs/system_compile.md.
  icl-exp run system_compile model=qwen2.5-0.5b preset=cpu
  icl-exp run system_compile model=gemma-3-270m template=prefix preset=cpu   (a base model: a prefix)
  icl-exp patch compile method=bake system="Always answer in French." check=french out=DIR

Its home: the declaration and what each preset changes; its config class, SystemCompileConfig, is in schema.py
beside it (its enums and nodes with it, which the package's modules import). Nothing heavy is imported here,
so that `icl-exp list` and a composition cost no torch; run.py, claims.py and plots.py hold what it does (run,
validate and plot, found by convention).
"""

from __future__ import annotations

from experiments.core.registry import Experiment
from experiments.goldwaser.system_compile.schema import SystemCompileConfig

# What each preset changes: only the keys that differ from the paper's defaults (schema.py).
PRESETS = {
    # preset=smoke: seconds, for tests and CI (a tiny random model: its behaviour checks fail, the plumbing runs).
    "smoke": {
        "model": "tiny-llama",
        "prompts": [
            {"name": "ahoy", "text": "Begin every answer with the word 'Ahoy'.", "check": "starts_with:Ahoy"},
        ],
        "queries": ["Hi?", "Why?", "How so?", "What now?", "Who?"],
        "heldout": 2,
        "max_new_tokens": 6,
        "rank": 2,
        "steps": 3,
        "batch": 2,
        "eval_every": 2,
    },
    # preset=cpu: qwen2.5-0.5b on 2 cores, offline, sized so that `icl-exp reproduce preset=cpu` stays near its
    # budget: two behaviours of the suite (a language, and a start word on a coherent reply), 8 fit and 8 held-out
    # queries, 24-token replies, a short bake (12 steps of 2), evaluated at the end only. Eight held-out replies
    # give a wide 95 % Wilson interval (about ±0.3 around 0.5): the six-behaviour run on the 56-query pool (16
    # held out each) is in docs/system_compile.md with its command, and the paper preset has all nine behaviours.
    "cpu": {
        "prompts": [
            {"name": "french", "text": "Always answer in French.", "check": "french"},
            {"name": "ahoy", "text": "Begin every answer with the word 'Ahoy'.", "check": "starts_with:Ahoy"},
        ],
        "queries": [
            "How do I reverse a list in Python?",
            "What is a closure?",
            "Why is the sky blue?",
            "Write a function that adds two numbers.",
            "What does HTTP stand for?",
            "How do I read a file line by line in Python?",
            "What is the difference between a list and a tuple?",
            "Explain recursion in simple terms.",
            "How can I sort a dictionary by its values?",
            "What is Git used for?",
            "How do I remove duplicates from a list?",
            "What is the capital of Australia?",
            "What should I cook for dinner tonight?",
            "How many planets are in the solar system?",
            "How does a bicycle stay upright?",
            "What is photosynthesis?",
        ],
        "heldout": 8,
        "max_new_tokens": 24,
        "steps": 12,
        "batch": 2,
        "eval_every": 0,
    },
}

EXPERIMENT = Experiment(
    paper="Goldwaser et al.",
    figures="(extension: system prompts)",
    description="a system prompt compiled into weights: analytic fixed patch vs prompt baking, on held-out queries",
    schema=SystemCompileConfig,
    presets=PRESETS,
)
