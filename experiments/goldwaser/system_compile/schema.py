"""system_compile's config class, SystemCompileConfig, its keys' types and their defaults (the one place they
are written; what a preset changes is PRESETS in the package's __init__.py, its home). Its own module, beside
the home, because the package's modules import it and its enums. Torch-free: registered before every
composition (config_store.register_schemas).

What composition cannot check (a positive rank or step count, a held-out split that leaves fit queries,
a known behaviour check, a chat template that has a system turn) is experiment.validate()'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from experiments.core.config_schema import MISSING, Common


class Template(StrEnum):
    """How the system prompt reaches the model: a system turn of its chat template, or text before the query
    (a base model, e.g. gemma-3-270m)."""

    chat = "chat"
    prefix = "prefix"


class Method(StrEnum):
    """The ways to put the prompt into the weights (the control and the prompted reference always run)."""

    analytic = "analytic"  # Table 1's fixed patch, least squares over the fit queries' positions
    bake = "bake"  # a LoRA trained on KL(prompted ‖ unprompted + LoRA)


class FitPositions(StrEnum):
    """Where the analytic patch is fitted: the reply's positions, or the query's own tokens too."""

    reply = "reply"
    suffix = "suffix"  # every token the prompted and unprompted inputs share at their end, and the reply


class Continuations(StrEnum):
    """The fit data both methods see: the prompted model's greedy reply to each fit query, or samples."""

    greedy = "greedy"
    sample = "sample"


class Format(StrEnum):
    """How save= keeps the compiled model: a stock checkpoint, or the change as a PEFT LoRA adapter."""

    merged = "merged"
    peft = "peft"  # adapter_config.json + adapter_model.safetensors: PeftModel.from_pretrained(base, DIR)


@dataclass
class SystemPrompt:
    name: str = MISSING  # a short name for tables and figures
    text: str = MISSING  # the system prompt
    check: str = MISSING  # french | starts_with:WORD | uppercase | json (behaviours.py)


def _default_prompts() -> list[SystemPrompt]:
    # imported here, not at the top: `icl-exp list` imports every experiment's home, this class with it, and
    # the behaviours' checks (their language detector's module) are wanted only once a config is made
    from experiments.goldwaser.system_compile.behaviours import SYSTEM_PROMPTS

    return [SystemPrompt(name, text, check) for name, text, check in SYSTEM_PROMPTS]


def _default_queries() -> list[str]:
    from experiments.goldwaser.system_compile.queries import QUERIES  # as _default_prompts': when a config is made

    return list(QUERIES)


@dataclass
class SystemCompileConfig(Common):
    model: str = "qwen2.5-0.5b"  # an instruction-tuned model with a chat template (or a base one, template=prefix)
    template: Template = Template.chat
    query_format: str = "Question: {query}\nAnswer:"  # template=prefix: the query as the model reads it
    prompts: list[SystemPrompt] = field(default_factory=_default_prompts)
    system: str | None = None  # one system prompt from the command line (replaces prompts=), with check=
    check: str | None = None
    queries: Any = field(default_factory=_default_queries)  # a list, or a text file with one query a line
    heldout: int = 16  # the last `heldout` queries are held out; the others are fitted on
    max_new_tokens: int = 48  # reply length: the reference reply, and every free generation
    stop_at_eos: str = "auto"  # end a reply at end of turn: auto = trained models only
    continuations: Continuations = Continuations.greedy
    samples: int = 1  # continuations=sample: sampled replies per fit query (seeded)
    temperature: float = 1.0  # continuations=sample
    methods: list[Method] = field(default_factory=lambda: [Method.analytic, Method.bake])
    # analytic
    fit_positions: FitPositions = FitPositions.suffix
    analytic_rank: int | None = None  # truncate every fitted ΔW to this rank (null: as least squares gives it)
    ridge: float = 0.0  # Tikhonov λ / mean ‖row‖² for the input matrices and an outer W_down (0: the lemma's pinv)
    # bake (peft LoRA)
    rank: int = 8
    alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=lambda: ["gate_proj", "up_proj", "down_proj"])
    steps: int = 60
    lr: float = 1e-3
    batch: int = 4  # fit sequences per optimizer step
    eval_every: int = 10  # the curve: KL during training every this many steps, on the validation queries when
    # there are some, else the held-out ones (0: at the end only)
    # budgets: the points each method is compiled at, chosen among on a validation split (budgets.py)
    validation: int = 0  # the last `validation` fit queries choose the budget point; no point is fitted on them
    analytic_ranks: list[int | None] = field(default_factory=list)  # [] = [analytic_rank]; null: full rank
    ridges: list[float] = field(default_factory=list)  # [] = [ridge]
    bake_ranks: list[int] = field(default_factory=list)  # [] = [rank]
    bake_steps: list[int] = field(default_factory=list)  # [] = [steps]
    # claims and artefacts
    kl_ratio: float = 0.9  # KL claims: a method's held-out KL at most this fraction of the other side's
    margin: float = 0.0  # behaviour claims: lower end of the 95 % interval above the control's upper end by this
    save: Method | None = None  # keep this method's checkpoint of the first prompt in the run folder
    format: Format = Format.merged  # save='s form (peft: analytic needs analytic_rank=, the adapter's rank)


__all__ = ["Continuations", "FitPositions", "Format", "Method", "SystemCompileConfig", "SystemPrompt",
           "Template"]
