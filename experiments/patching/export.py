"""One prompt's context moved into a model's weights, compared, and saved as a Hugging Face checkpoint
(`icl-exp patch export`; from Python, docs/python.md).

`patch_prompt(bundle, prompt, variant)` patches every decoder layer for the prompt's last token x (the
`Patcher`: each layer's input matrices and output parameter, e.g. Gemma's W_gate, W_up, post-MLP scale
(and W_down in the closed loop, which makes the patch survive a stock reload: closed_loop.py); Llama's
W_gate, W_up, W_down; GPT-2's c_fc weight and c_proj bias) and returns the patched tensors beside three
next-token logits: the model's after the whole prompt, the patched weights' fed x alone, and the control's,
the unpatched model fed x alone. `save_patched` writes those tensors into a copy of the weights saved with
`save_pretrained`: stock `AutoModelForCausalLM.from_pretrained(DIR/patched)` loads it, and fed x alone it
gives the original model's next-token logits after the whole prompt. `export_patched` is the two in one.

DIR/patched   the patched checkpoint (safetensors + config + tokenizer)
DIR/base      the original model, for random models that exist nowhere else
DIR/inputs.json  context_ids, query_id, and what was checked at export time
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.core.atomic import save_pretrained, write_json_atomic
from experiments.core.errors import UserError
from experiments.patching.compare import logit_comparison
from experiments.patching.patcher import PatchedPass, Patcher, patched_weights
from experiments.patching.variants import VARIANTS, ClosedLoopLastLayer, Variant
from experiments.zoo.bundle import ModelBundle
from experiments.zoo.prompts import encode_prompt

LAST_LAYER = ClosedLoopLastLayer.name
PAPER_PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


@dataclass
class PromptPatch:
    """A prompt's context moved into the weights, for its last token (the query), with what it is judged by."""

    prompt: str
    variant: Variant  # variant.evidence: an open loop (the paper's method) or the closed loop (a construction)
    context_ids: torch.Tensor  # (1, n - 1): the prompt's tokens but the last
    query: torch.Tensor  # (1, 1): the prompt's last token, all the patched model is fed
    tensors: dict[str, torch.Tensor]  # full parameter name -> its patched value, W + ΔW in the model's dtype
    with_context: torch.Tensor  # (vocab,) the model's next-token logits after the whole prompt
    patched: torch.Tensor  # (vocab,) the patched weights' logits, fed the query alone
    control: torch.Tensor  # (vocab,) the unpatched model's logits, fed the query alone: what the patch must change
    passed: PatchedPass  # the patched pass: per-layer errors against the with-context record, div_zero, no_root
    # a closed loop's control, the closed loop at the last layer alone: same logits, far from the record before it
    last_layer: PatchedPass | None = None


@torch.no_grad()
def patch_prompt(bundle: ModelBundle, prompt: str, variant: str = "naive", chat_template: bool = True) -> PromptPatch:
    """Patch every layer of `bundle.model` for the last token of `prompt` (through the chat template when the
    tokenizer has one and `chat_template`); the model itself is left as it was."""
    if bundle.multimodal:
        raise UserError("patch export writes text-only checkpoints (e.g. Gemma3ForCausalLM); "
                        f"{bundle.name} is multimodal")
    device = next(bundle.model.parameters()).device
    ids = encode_prompt(bundle, prompt, None, chat_template, device)["input_ids"]
    if ids.shape[1] < 2:
        raise UserError("the prompt must have at least two tokens: a context and the query token")
    patcher = Patcher(bundle.model, variant)
    cache, query = patcher.start({"input_ids": ids})
    step = patcher.context_step({"input_ids": query}, cache)
    control = patcher.control_logits(query)
    tensors: dict[str, torch.Tensor] = {}
    result = patcher.patched_pass(query, step, keep=tensors)
    last = None if patcher.variant.evidence else patcher.patched_pass(query, step, variant=VARIANTS[LAST_LAYER])
    return PromptPatch(prompt, patcher.variant, ids[:, :-1], query, tensors, step.logits, result.logits, control,
                       result, last)


def save_patched(bundle: ModelBundle, patch: PromptPatch, out_dir: Path) -> dict:
    """Write DIR/patched (+ DIR/base for random models) and DIR/inputs.json; return the summary. The bundle's
    model keeps its own weights."""
    model, tok = bundle.model, bundle.tokenizer
    out_dir = Path(out_dir)
    if bundle.is_random:
        save_pretrained(model, out_dir / "base")  # with the umask: transformers writes 0600 safetensors
        tok.save_pretrained(out_dir / "base")
    with patched_weights(model, patch.tensors):
        save_pretrained(model, out_dir / "patched")
    tok.save_pretrained(out_dir / "patched")
    check = logit_comparison(patch.with_context, patch.patched)
    reference, control = int(patch.with_context.argmax()), int(patch.control.argmax())
    summary = {
        "model": bundle.name, "model_type": model.config.model_type, "prompt": patch.prompt,
        "variant": patch.variant.name, "loop": patch.variant.loop, "evidence": patch.variant.evidence,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "context_ids": patch.context_ids[0].tolist(), "query_id": int(patch.query),
        "reference_top1": reference, "control_top1": control,
        "next_token_with_context": tok.decode([reference]), "next_token_without_context": tok.decode([control]),
        "logit_linf_at_export": check["logit_linf"], "top1_match_at_export": bool(check["top1_match"]),
        "div_zero": patch.passed.div_zero, "no_root": patch.passed.no_root,
        "has_base": bundle.is_random,
    }
    write_json_atomic(out_dir / "inputs.json", summary)
    return summary


def export_patched(bundle: ModelBundle, prompt: str, out_dir: Path, variant: str = "naive",
                   chat_template: bool = True) -> dict:
    """patch_prompt, then save_patched: the summary, with the with-context and control logits beside it."""
    patch = patch_prompt(bundle, prompt, variant, chat_template)
    summary = save_patched(bundle, patch, out_dir)
    summary["reference_logits"] = patch.with_context  # not in inputs.json: for the caller's own check
    summary["control_logits"] = patch.control
    summary["passed"], summary["last_layer"] = patch.passed, patch.last_layer  # per-layer errors, for the claims
    return summary
