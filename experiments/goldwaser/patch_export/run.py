"""patch_export — one prompt's context moved into a model's weights, saved as a stock checkpoint.

`icl-exp patch export model=tiny-llama prompt="..." [out=DIR]` (or `icl-exp run patch_export ...`):
the patcher (any supported architecture, any variant) patches every layer for the prompt's last token,
the patched model is saved with `save_pretrained` into RUN/patched (and the original random model into
RUN/base, since it exists nowhere else), and the check is independent of the patching code: stock
`AutoModelForCausalLM.from_pretrained(RUN/patched)` in a fresh process (in float64 with the project's float64
norms and rotary tables, `zoo/fresh_reload.py`), fed the query token alone, against the witness's uncached
forward of the whole prompt (patching/witness.py), within the dtype's bar (patching/compare.ROUNDING); beside
it the cached pass the patch came from against the same forward, and inputs.json's tokens against the
prompt's. An open loop's export is evidence (`goldwaser.export.*`); a closed loop's is a construction
(`goldwaser.construction.export.*`), beside its control, the closed loop at the last layer alone, and its
per-layer error against the record.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pandas as pd

from experiments.core.errors import UserError
from experiments.core.results import RunContext
from experiments.goldwaser.patch_export import PatchExportConfig

log = logging.getLogger(__name__)
REF = "Goldwaser §3 Thm 1 / Alg. 1 (exported)"


def validate(cfg: PatchExportConfig) -> None:
    from experiments.goldwaser.common import validate_model

    if not cfg.prompt.strip():
        raise UserError("prompt= is empty: the export needs a prompt (a context and its last token)")
    validate_model(cfg, [cfg.prompt], 1)  # model, architecture, variant, memory (the witness's forward too)


def run(cfg: PatchExportConfig, ctx: RunContext) -> None:
    from transformers.utils import logging as hf_logging

    from experiments.core.runtime import dtype_name
    from experiments.patching.arch import adapter_for
    from experiments.patching.compare import logit_comparison, logit_dtype
    from experiments.patching.export import export_patched
    from experiments.patching.load import implementation_kwargs, load_checked, model_label
    from experiments.patching.witness import Witness
    from experiments.zoo.fresh_reload import fresh_logits
    from experiments.zoo.prompts import encode_prompt
    from experiments.zoo.threads import threads_for

    hf_logging.disable_progress_bar()  # no "Writing model shards" / "Loading weights" bars between our lines
    ctx.model = model_label(cfg.model)
    bundle = load_checked(cfg.model, ctx.dtype, ctx.device, seed=cfg.seed)
    variant = chosen_variant(cfg, bundle.model.config.model_type)
    log.info("variant %s: %s", variant.name, describe(variant))
    # the witness (patching/witness.py) is made before the pipeline touches the model: its reference, an
    # uncached forward of the prompt encoded here, is what the export is judged by
    witness = Witness(bundle.model, adapter_for(bundle.model.config.model_type).layers, logit_dtype(ctx.dtype))
    ids = encode_prompt(bundle, cfg.prompt, None, cfg.chat_template, ctx.device)["input_ids"]
    with threads_for(bundle.model):
        summary = export_patched(bundle, cfg.prompt, ctx.run_dir, variant.name, cfg.chat_template)
        reference = witness.reference({"input_ids": ids}, [], 1).logits[0]
    cached, control = summary["reference_logits"], summary["control_logits"]
    # the checkpoint as a user meets it: stock transformers in a fresh process, fed the query it says it holds
    got = fresh_logits(ctx.run_dir / "patched", summary["query_id"], ctx.dtype, ctx.device,
                       implementation_kwargs(bundle.model.config))
    check = logit_comparison(reference, got)
    ctrl = logit_comparison(reference, control)
    index = dict(model=cfg.model, dtype=dtype_name(ctx.dtype), variant=variant.name)
    ctx.log_many(check, **index)
    ctx.log_many({f"control_{k}": v for k, v in ctrl.items()}, **index)
    ctx.log("cached_vs_uncached_logit_linf_rel", logit_comparison(reference, cached)["logit_linf_rel"], **index)
    # the prompt it says it holds is the prompt asked for, token for token
    ctx.log("holds_prompt", float(summary["context_ids"] + [summary["query_id"]] == ids[0].tolist()), **index)
    decode = bundle.tokenizer.decode
    log.info("next token with the context %r; the patched checkpoint (stock reload) without it %r; the unpatched "
             "model without it %r", summary["next_token_with_context"], decode([int(got.argmax())]),
             summary["next_token_without_context"])
    where = f"{cfg.model}, {dtype_name(ctx.dtype)}, {variant.name}"
    check_claims(ctx, check, ctrl, summary, variant, dtype_name(ctx.dtype), where)
    record_claims(ctx, ctx.metrics(), dtype_name(ctx.dtype), cfg.model, where)


def record_claims(ctx: RunContext, m: pd.DataFrame, dtype: str, model: str, where: str) -> None:
    """The with-context side: the cached pass the patch was computed from against the witness's uncached
    forward of the prompt asked for, and the checkpoint's inputs.json naming that prompt's tokens."""
    from experiments.core.reduce import reduce_metric
    from experiments.goldwaser.record_claim import cached_claim

    cached_claim(ctx, m, dtype, model)
    ctx.check("goldwaser.record.export_holds_prompt", REF + " (the with-context side)",
              f"the exported checkpoint's inputs.json names the prompt's own tokens, the context and the query "
              f"({where})", reduce_metric(m, "holds_prompt", "min"), ">=", 1.0,
              measure="same tokens (1) or not (0)", exact=True)


def check_claims(ctx: RunContext, check: dict, ctrl: dict, summary: dict, variant, dtype: str, where: str) -> None:
    """An open loop's export is evidence (`goldwaser.export.*`); a closed loop's is a construction
    (`goldwaser.construction.export.*`): its logits agree by design, so beside them stand its control, the
    closed loop at the last layer alone, and what tells them apart, the per-layer error against the record."""
    from experiments.patching.compare import LAYER_EXACT, RECORD_DECADES, rounding_bar

    kind = "goldwaser.export" if variant.evidence else "goldwaser.construction.export"
    ref = REF if variant.evidence else f"{REF} (construction: the closed loop solves for the with-context output)"
    ctx.check(f"{kind}.top1_reproduced", ref,
              f"stock transformers loads the patched checkpoint and, fed the query token alone, picks the "
              f"original model's next token after the whole prompt ({where})", check["top1_match"], ">=", 1.0,
              measure="top-1 agrees (1) or not (0)", exact=True)
    # The control: the unpatched model fed the query alone agrees on top-1 about half the time on a trained
    # model, so a top-1 match alone (the only claim in bfloat16) says little. The patched logits must be
    # much closer to the with-context ones than the control's are.
    ctx.check(f"{kind}.control_differs", ref + " (control)",
              f"the control (unpatched model, query token alone) is far off where the exported checkpoint is "
              f"close: log10 of the logit L∞ ratio control / patched ({where})",
              math.log10(ctrl["logit_linf"] / max(check["logit_linf"], 1e-300)), ">=", 1.0,
              measure="log10(control L∞ / patched L∞)")
    if dtype in ("float32", "float64"):
        ctx.check(f"{kind}.logits_reproduced", ref,
                  f"...and its logits equal the original model's at {dtype}'s rounding level: max |Δlogit| / max "
                  f"|logit| ({where})", check["logit_linf_rel"], "<=", rounding_bar(dtype), exact=True)
    last = summary.get("last_layer")
    if variant.evidence or last is None:
        return
    passed = summary["passed"]
    if dtype in ("float32", "float64"):
        ctx.check(f"{kind}.last_layer_control_logits", ref + " (control)",
                  f"its control, the closed loop at the last layer alone (every other layer unpatched), reaches the "
                  f"with-context logits as well: max |Δlogit| / max |logit| ({where})",
                  _rel(last.logits, summary), "<=", rounding_bar(dtype))
        ctx.check(f"{kind}.every_layer", ref,
                  f"the exported patch's pass: every layer's output against the record of the with-context pass, "
                  f"max relative error over layers ({where})", max(passed.hidden_rel), "<=", LAYER_EXACT[dtype])
    before_last = sorted(last.hidden_rel[:-1]) or [float("nan")]
    ratio = before_last[len(before_last) // 2] / max(max(passed.hidden_rel), 1e-300)
    ctx.check(f"{kind}.every_layer_control", ref + " (control)",
              f"what tells the closed loop from its control: log10 of the control's median per-layer error against "
              f"the record (layers before the last) over the exported closed loop's largest ({where})",
              math.log10(max(ratio, 1e-300)), ">=", RECORD_DECADES[dtype], measure="log10(control / closed loop)")


def _rel(logits, summary: dict) -> float:
    from experiments.patching.compare import logit_comparison

    return logit_comparison(summary["reference_logits"], logits)["logit_linf_rel"]


def chosen_variant(cfg: PatchExportConfig, model_type: str):
    """variant=..., or where none is given an open loop exact on the family, the closed loop only where none
    is (patching/variants.export_default)."""
    from experiments.patching.arch import adapter_for
    from experiments.patching.variants import VARIANTS, check_variant, export_default

    adapter = adapter_for(model_type)
    return check_variant(adapter, cfg.variant) if cfg.variant else VARIANTS[export_default(adapter)]


def describe(variant) -> str:
    """What the exported patch is: the paper's open loop (evidence) or the closed loop (a construction)."""
    if variant.evidence:
        return (f"{variant.source}, open loop: every patch from the with-context pass alone; agreement is "
                "evidence for Thm 1")
    return ("closed loop, a construction: each layer solved for the with-context output itself; exact by "
            "design, no evidence for Thm 1")


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    return []  # a checkpoint, not a figure: RUN/patched, RUN/inputs.json
