"""system_compile — a system prompt compiled once into the weights, applied to user queries it never saw
(beyond the papers).

Goldwaser et al. (§6) patch every token anew; context_compile fits one fixed patch at the positions of one
reply. What a user who wants a prompt in the weights asks is a SYSTEM prompt ("Always answer in French.")
compiled once and then applied to new queries without its tokens. For each system prompt:
1. The model given the system prompt answers every query greedily (the reference; study.py). The queries
   are split into fit and held-out ones (the last `heldout=`).
2. Control: the same model without the prompt, along the same replies and on its own free generations.
3. Each method puts the prompt into the weights from the fit queries' continuations only:
   - analytic: Table 1's fixed patch, least squares over every aligned position of every fit sequence,
     closed loop (analytic.py);
   - bake: a peft LoRA trained on KL(prompted ‖ unprompted + LoRA) (bake.py), merged into the weights.
   With budget grids (budgets.py) each method's point is chosen first on a validation split of the fit
   queries; the held-out queries choose nothing.
   Each is measured (measure.py) without the system prompt: the next-token KL and top-1 agreement along the
   prompted model's greedy reply, and the behaviour check (behaviours.py) on its own free generations, on
   the fit queries (for the analytic patch a construction) and on the held-out ones (the evidence). The
   compile wall time and the budget (rank, parameters of the factored change, entries changed) go beside.
4. `save=METHOD` keeps that method's checkpoint of the first system prompt in the run folder (checkpoint.py),
   reloaded in stock transformers and measured there (`icl-exp patch compile method=... ` does this).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from experiments.core.errors import UserError
from experiments.core.results import RunContext
from experiments.core.validation import require_positive
from experiments.goldwaser.system_compile.schema import SystemCompileConfig

log = logging.getLogger(__name__)
GENERATIONS_FILE = "generations.json"  # every method's free generations, per system prompt and split


# -- config ---------------------------------------------------------------------------------------
def system_prompts(cfg: SystemCompileConfig):
    """The system prompts to compile: `system=` with `check=` when given, else `prompts=`."""
    from experiments.goldwaser.system_compile.behaviours import CHECK_FORMS, check_for
    from experiments.goldwaser.system_compile.study import Prompt

    if cfg.system is not None:
        if not cfg.system.strip():
            raise UserError("system= is empty: give the system prompt to compile")
        if not cfg.check:
            raise UserError(f"system= needs check= to measure its effect: {' | '.join(CHECK_FORMS)}")
        prompts = [Prompt("system", cfg.system, cfg.check)]
    else:
        if not cfg.prompts:
            raise UserError("prompts= is empty: give system prompts [{name: ..., text: ..., check: ...}] or "
                            "system=TEXT")
        prompts = [Prompt(str(p.name), str(p.text), str(p.check)) for p in cfg.prompts]
    for p in prompts:
        if not p.text.strip():
            raise UserError(f"system prompt {p.name!r} is empty")
        check_for(p.check)
    names = [p.name for p in prompts]
    if len(set(names)) != len(names):
        raise UserError(f"system prompt names must differ: {', '.join(names)}")
    return prompts


def load_tokenizer(name: str):
    """The model's tokenizer alone (no weights): what the template check needs before any model is loaded."""
    from experiments.core.errors import first_line
    from experiments.patching.load import CATALOG, RANDOM_OFFLINE_MODELS
    from experiments.zoo.loading import hub_reachable, local_checkpoint
    from experiments.zoo.tokenizer import byte_tokenizer

    if name in RANDOM_OFFLINE_MODELS:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    path = local_checkpoint(name, CATALOG)  # a GGUF's architecture checked before it is converted
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=Path(path).expanduser().exists()
                                             or not hub_reachable())
    except Exception as err:
        raise UserError(f"cannot load the tokenizer of model={name}: {first_line(err)}") from None


def check_lora_targets(config, targets: list[str], model: str) -> None:
    """Every LoRA target names modules of the model (built on the meta device: nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.zoo.quiet import quiet_transformers

    with torch.device("meta"), quiet_transformers():
        names = [n for n, _ in AutoModelForCausalLM.from_config(config).named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = {n.rsplit(".", 1)[-1] for n in names}
        linear = sorted(x for x in leaves if x.endswith(("proj", "fc", "c_attn")))
        raise UserError(f"lora_targets={list(targets)}: {', '.join(missing)} names no module of {model} "
                        f"(its projections: {', '.join(linear) or 'none found'})")


def validate(cfg: SystemCompileConfig) -> None:
    """Everything checkable before a run folder exists and before any model is loaded."""
    from experiments.core.runtime import resolve_device
    from experiments.goldwaser.common import check_context_length, check_stop_at_eos, text_only
    from experiments.goldwaser.system_compile.adapter_checks import check_peft
    from experiments.goldwaser.system_compile.budgets import check_budgets
    from experiments.goldwaser.system_compile.inputs import check_not_default, check_template, encode, split
    from experiments.patching.arch import adapter_for
    from experiments.patching.fixed_patch import check_fixed_patch
    from experiments.patching.load import check_patchable

    prompts = system_prompts(cfg)
    fit, held = split(cfg)
    require_positive(cfg, "max_new_tokens", "rank", "steps", "batch", "samples")
    if cfg.analytic_rank is not None:
        require_positive(cfg, "analytic_rank")
    if cfg.ridge < 0:
        raise UserError(f"ridge={cfg.ridge} must be 0 (the least-squares lemma) or more")
    if cfg.eval_every < 0:
        raise UserError(f"eval_every={cfg.eval_every} must be 0 (at the end only) or more")
    for key in ("lr", "alpha", "temperature", "kl_ratio"):
        if not getattr(cfg, key) > 0:
            raise UserError(f"{key}={getattr(cfg, key)} must be positive")
    methods = [str(m) for m in cfg.methods]
    if not methods or len(set(methods)) != len(methods):
        raise UserError(f"methods={methods} must name analytic and/or bake, each once")
    check_budgets(cfg, methods, len(fit))
    if cfg.save is not None and cfg.save not in methods:
        raise UserError(f"save={cfg.save} is not among methods={methods}")
    if cfg.format == "peft" and cfg.save is None:
        raise UserError("format=peft is the form of the saved model: give save=analytic|bake with it")
    check_stop_at_eos(cfg)
    if "bake" in methods and (not isinstance(cfg.lora_targets, list) or not cfg.lora_targets):
        raise UserError("lora_targets= is empty: the LoRA needs the modules it adapts, e.g. "
                        "[gate_proj,up_proj,down_proj]")
    config = check_patchable(cfg.model, cfg.dtype.torch, resolve_device(cfg.device))
    text_only(cfg, config)
    adapter = adapter_for(config.model_type)  # one line naming the supported ones
    if "analytic" in methods:
        check_fixed_patch(adapter)
    if "bake" in methods:
        check_lora_targets(config, list(cfg.lora_targets), cfg.model)
    check_peft(cfg, config)  # format=peft: a change the adapter could not hold, refused before the model loads
    tok = load_tokenizer(cfg.model)
    check_template(tok, cfg.template, cfg.model)
    for p in prompts:
        check_not_default(encode(tok, cfg.template, cfg.query_format, p.text, fit[0]), p.name,
                          cfg.model)
    lengths = [len(encode(tok, cfg.template, cfg.query_format, p.text, q).prompted)
               for p in prompts for q in fit + held]
    check_context_length(config, lengths, cfg.max_new_tokens)
    if cfg.format == "peft" and cfg.save == "analytic" and cfg.analytic_rank is None:
        # the least-squares ΔW has a direction per fit position: that is the rank a LoRA would need
        ids = [encode(tok, cfg.template, cfg.query_format, prompts[0].text, q) for q in fit]
        per = [(i.shared - 1 if cfg.fit_positions == "suffix" else 0) + cfg.max_new_tokens for i in ids]
        rank = min(sum(per) * max(1, cfg.samples), int(config.hidden_size))
        raise UserError(f"format=peft: the analytic patch is not low rank (up to rank {rank}, one direction per fit "
                        "position): give analytic_rank=R for a rank-R adapter, or format=merged")


# -- the run --------------------------------------------------------------------------------------
def run(cfg: SystemCompileConfig, ctx: RunContext) -> None:
    from experiments.core.atomic import write_json_atomic
    from experiments.core.progress import progress
    from experiments.core.samples import reply_sample
    from experiments.goldwaser.common import stop_ids
    from experiments.goldwaser.system_compile.checkpoint import save_checkpoint
    from experiments.goldwaser.system_compile.claims import check_claims, pooled
    from experiments.goldwaser.system_compile.inputs import encode, split
    from experiments.goldwaser.system_compile.measure import Generation
    from experiments.goldwaser.system_compile.study import run_prompt
    from experiments.goldwaser.system_compile.table import write_summary
    from experiments.patching.arch import adapter_for
    from experiments.patching.load import load_checked, model_label
    from experiments.zoo.threads import threads_for

    ctx.model = model_label(cfg.model)  # validate() ran once, on the command line (cli/overrides.check_job)
    prompts = system_prompts(cfg)
    fit, held = split(cfg)
    bundle = load_checked(cfg.model, ctx.dtype, ctx.device, seed=cfg.seed)
    model, tok = bundle.model, bundle.tokenizer
    adapter = adapter_for(model.config.model_type)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    gen = Generation(cfg.max_new_tokens, frozenset(stop_ids(cfg, bundle)), int(pad),
                     functools.partial(tok.decode, skip_special_tokens=True))
    save = functools.partial(save_checkpoint, cfg) if cfg.save is not None else None
    generations: dict = {}
    with threads_for(model), progress(len(prompts), "system prompts") as bar:
        # the control's free generations: the unprompted model does not depend on the system prompt
        plain = [encode(tok, cfg.template, cfg.query_format, prompts[0].text, q).plain for q in fit + held]
        control = gen.free(model, plain)
        for p, prompt in enumerate(prompts):
            generations[prompt.name] = run_prompt(cfg, ctx, bundle, adapter, gen, p, prompt, fit, held, control,
                                                  save if p == 0 else None)
            write_json_atomic(ctx.path(GENERATIONS_FILE), dict(fit=fit, heldout=held, system=generations))
            texts = generations[prompt.name]  # and per query, each method beside the prompted model: samples.jsonl
            for method in (m for m in texts if m not in ("reference", "control")):
                for where, queries, first in (("fit", fit, 0), ("heldout", held, len(fit))):
                    for i, query in enumerate(queries):  # query=: the metrics' index, over fit + held-out
                        ctx.sample(reply_sample(texts["reference"][where][i], texts[method][where][i],
                                                texts["control"][where][i], system=prompt.name, method=method,
                                                split=where, query=first + i, prompt=query))
            ctx.flush()
            bar.advance(1, info=prompt.name)
    verdicts = check_claims(cfg, ctx, ctx.metrics())
    for metric, value, index in pooled(ctx.metrics(), [str(x) for x in cfg.methods], verdicts):
        ctx.log(metric, value, **index)  # a summary over prompts (summary.md), never a claim
    ctx.flush()
    log.info("per-behaviour table: %s", write_summary(ctx.run_dir))
