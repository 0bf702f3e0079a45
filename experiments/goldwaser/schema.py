"""Goldwaser et al.'s experiments, their keys, types and paper defaults: patch_match and gemma_match
(patch_match's keys and values, with Gemma 3 and the paper's open loop: a subclass), patch_export,
layer_errors and context_compile. The patch variants are an Enum, as is every key that takes one of a few
names (in a list too: dtypes=, variants=), the rest typed, so `k=many` or `variant=fast` fails while
composing. What needs the model (its architecture, the variants it supports, k against its rank), the
prompts file, ranges and keys against each other stay in each experiment's validate(). What a preset
changes is in conf/preset_for/<name>/. Torch-free: registered before every composition."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from experiments.core.config_schema import default, experiment_schemas
from experiments.goldwaser.system_compile.schema import SystemCompile  # its own module
from experiments.patching.kinds import ADVANCE_MODES, APPLY_MODES
from experiments.patching.variants import VARIANTS

# experiments/patching/variants.py's VARIANTS, in its order: the registry is the one list of names (torch-free)
PatchVariant = StrEnum("PatchVariant", {name: name for name in VARIANTS})
PatchApply = StrEnum("PatchApply", {name: name for name in APPLY_MODES})
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


# layer_errors' `dtypes=`: float64 end to end beside float32 (no half precision: its claims are about rounding
# well below the bars the 16-bit formats set)
LayerDtype = StrEnum("LayerDtype", {name: name for name in ("float32", "float64")})


# Fig. 3's prompt (patch_match's, patch_export's, and one of layer_errors')
MARS_PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


@dataclass
class PatchMatch:
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


@dataclass
class GemmaMatch(PatchMatch):
    """gemma_match (§4, Figs. 3–5): the paper's settings, patch_match's with Gemma 3 and the paper's open
    loop."""

    # hub id | local folder | PATH.gguf | offline: gemma-3-270m (real, trained), tiny-gemma3, gemma3-1b-random,
    # tiny-gemma3-vision
    model: str = "google/gemma-3-1b-it"
    # naive (Alg. 1, open loop) | stable (App. B: RMSNorm inversion, ΔW_down)
    # | conditioned (open loop, ΔW_down to C·sign(d_C): Eq. 4 divides by ±1)
    # | closed_loop, closed_loop_scale (constructions, exact by design)
    variant: PatchVariant = PatchVariant.naive


@dataclass
class PatchExport:
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


@dataclass
class LayerErrors:
    """layer_errors (Alg. 1 open loop and the closed loop, layer by layer)."""

    # the real, trained Gemma 3 270M (offline); qwen2.5-0.5b | tiny-gemma3 | a local folder | a hub id
    model: str = "gemma-3-270m"
    # this experiment's own dtypes, float32 | float64 (the model is loaded once in each; dtype= is not used)
    dtypes: list[LayerDtype] = default([LayerDtype.float32, LayerDtype.float64])
    # naive | stable | conditioned | closed_loop_scale | closed_loop; null: naive, closed_loop_scale where the block
    # has a post-MLP norm, closed_loop (with apply=action: the open loop alone)
    variants: list[PatchVariant] | None = None
    # the open loop's matrices: materialized (W + ΔW rounded) | action (W·z + c (vᵀz) in the dtype; see PatchMatch)
    apply: PatchApply = PatchApply.materialized
    prompts: list[str] = default([
        "List three reasons why octopuses are considered intelligent animals.",
        MARS_PROMPT,
        "Explain in two sentences why the sky is blue.",
        "Give three tips for keeping a sourdough starter alive.",
    ])
    chat_template: bool = True  # wrap each prompt in the model's chat template when it has one
    max_new_tokens: int = 16  # tokens per prompt (greedy, with the context); each is patched and measured
    # |δ| / |x| of the random input change that measures a layer's gain: well above float32 rounding (6e-8) of
    # the layer's output in float32
    delta_rel: dict[str, float] = default({"float32": 1.0e-3, "float64": 1.0e-6})


@dataclass
class ContextCompile:
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


# Each experiment's schema, registered by config_schema.register_schemas (experiment_schema binds it to
# this module as <Name>Config).
# experiment name -> schema, each name from its class name (SystemCompile -> system_compile)
SCHEMAS = experiment_schemas(PatchMatch, GemmaMatch, PatchExport, LayerErrors, ContextCompile, SystemCompile)
