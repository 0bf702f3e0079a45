"""context_compile — a prompt compiled once into fixed weights, and how far that carries (beyond the papers).

Goldwaser et al. (§6) note that their patches depend on the token and are recomputed at every step. This
experiment measures how far ONE weight change can stand in for a prompt. For each prompt:
1. The model with the prompt generates greedily (its reply: G tokens). With `per_token`, every step is
   also patched per token (`patcher.Patcher`, the family's exact open loop, the closed loop where none is:
   `variants.export_default`): the upper bound.
2. One teacher-forced forward of prompt + reply gives the reference logits and, per layer, the targets
   (MLP input and layer output) at the reply's positions.
3. For every k of the sweep, the fixed patch is fitted at the first k positions of the no-context
   sequence [start] + reply (`patching/fixed_patch.py`: least-squares lemmas, closed loop), and a stock
   forward of the patched weights on that sequence, teacher-forced, is compared with the reference at
   every position: top-1 agreement, TVD, logit L∞. Positions < k are fitted, the next `heldout` are held
   out. Beside it: the unpatched model on the same sequence (the control) and a perturbed fit (every
   change ×1.01), the control of the exactness check. Agreement at the fitted positions is a construction
   (least squares checked where it was fitted: `context_compile.construction.*`); the held-out positions are
   the evidence.
4. For the first prompt and k = `k`, the patched model is saved as a stock checkpoint in the run folder
   (`save`), reloaded with `AutoModelForCausalLM.from_pretrained`, and measured again there: teacher-
   forced agreement, and a free-running greedy generation from [start] alone against the reply.
"""

from __future__ import annotations

from experiments.core.errors import UserError
from experiments.core.results import RunContext
from experiments.goldwaser.context_compile import ContextCompileConfig


# -- config ---------------------------------------------------------------------------------------
def validate(cfg: ContextCompileConfig) -> None:
    """Everything checkable before a run folder exists: the model, its architecture, k against its rank."""
    from experiments.core.runtime import resolve_device
    from experiments.goldwaser.common import check_stop_at_eos, prompt_list, text_only
    from experiments.goldwaser.context_compile.measure import sweep_ks
    from experiments.patching.arch import adapter_for
    from experiments.patching.fixed_patch import check_fixed_patch, rank_limit
    from experiments.patching.load import check_patchable

    if not cfg.prompt.strip():
        raise UserError("prompt= is empty: the compiled patch needs a prompt")
    ks = sweep_ks(cfg)
    if ks[0] < 1:
        raise UserError(f"k={ks[0]} must be at least 1 (k and every value of sweep=)")
    if cfg.heldout < 0:
        raise UserError(f"heldout={cfg.heldout} must be 0 or more")
    check_stop_at_eos(cfg)
    prompt_list(cfg)
    config = check_patchable(cfg.model, cfg.dtype.torch, resolve_device(cfg.device))
    text_only(cfg, config)
    adapter = adapter_for(config.model_type)  # one line naming the supported ones
    check_fixed_patch(adapter)
    limit = rank_limit(config, adapter)
    if ks[-1] > limit:
        raise UserError(f"k={ks[-1]} is more than {cfg.model}'s layers allow: the input update is exact at k "
                        f"positions only for k independent MLP inputs, which have d={limit} coordinates "
                        f"(k ≤ {limit})")


# -- the run --------------------------------------------------------------------------------------
def run(cfg: ContextCompileConfig, ctx: RunContext) -> None:
    from experiments.goldwaser.common import prompt_list, stop_ids
    from experiments.goldwaser.context_compile.claims import check_claims
    from experiments.goldwaser.context_compile.measure import compile_prompt
    from experiments.patching.load import load_checked, model_label
    from experiments.zoo.threads import threads_for

    ctx.model = model_label(cfg.model)
    bundle = load_checked(cfg.model, ctx.dtype, ctx.device, seed=cfg.seed)
    prompts = prompt_list(cfg)
    with threads_for(bundle.model):
        for p, text in enumerate(prompts):
            compile_prompt(cfg, ctx, bundle, p, text, stop_ids(cfg, bundle),
                           save_to=ctx.run_dir if (p == 0 and cfg.save) else None)
    check_claims(cfg, ctx, ctx.metrics())
