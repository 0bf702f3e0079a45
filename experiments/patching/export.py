"""A Hugging Face checkpoint with one prompt's context moved into its weights (`icl-exp patch export`).

For a prompt (context C, last token x) the patcher gives every decoder layer its patched tensors (the
adapter's input matrices and output parameter: e.g. Gemma's W_gate, W_up, post-MLP scale (and W_down
in the closed loop, which makes the patch survive a stock reload: closed_loop.py); Llama's
W_gate, W_up, W_down; GPT-2's c_fc weight and c_proj bias). They are written into the model, which is
saved with `save_pretrained`: stock `AutoModelForCausalLM.from_pretrained(DIR/patched)` loads it, and
fed x alone it gives the original model's next-token logits after the whole prompt.

DIR/patched   the patched checkpoint (safetensors + config + tokenizer)
DIR/base      the original model, for random models that exist nowhere else
DIR/inputs.json  context_ids, query_id, and what was checked at export time
"""

from __future__ import annotations

from pathlib import Path

import torch

from experiments.core.atomic import save_pretrained, write_json_atomic
from experiments.core.errors import UserError
from experiments.patching.compare import logit_comparison
from experiments.patching.patcher import Patcher
from experiments.zoo.bundle import ModelBundle
from experiments.zoo.prompts import encode_prompt

PAPER_PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


@torch.no_grad()
def export_patched(bundle: ModelBundle, prompt: str, out_dir: Path, variant: str = "naive",
                   chat_template: bool = True) -> dict:
    """Write DIR/patched (+ DIR/base for random models) and DIR/inputs.json; return the summary."""
    if bundle.multimodal:
        raise UserError("patch export writes text-only checkpoints (e.g. Gemma3ForCausalLM); "
                        f"{bundle.name} is multimodal")
    model, tok = bundle.model, bundle.tokenizer
    device = next(model.parameters()).device
    ids = encode_prompt(bundle, prompt, None, chat_template, device)["input_ids"]
    if ids.shape[1] < 2:
        raise UserError("the prompt must have at least two tokens: a context and the query token")
    out_dir = Path(out_dir)
    if bundle.is_random:
        save_pretrained(model, out_dir / "base")  # with the umask: transformers writes 0600 safetensors
        tok.save_pretrained(out_dir / "base")

    patcher = Patcher(model, variant)
    cache = patcher.prefill({"input_ids": ids[:, :-1]})
    query = ids[:, -1:]
    step = patcher.context_step({"input_ids": query}, cache)
    reference = step.logits
    control = patcher.control_logits(query)  # the unpatched model, the query alone: what the patch must change
    patched_tensors: dict[str, torch.Tensor] = {}
    result = patcher.patched_pass(query, step, keep=patched_tensors)
    params = dict(model.named_parameters())
    for name, tensor in patched_tensors.items():
        params[name].copy_(tensor)  # the model is ours (loaded for this export): patch in place
    save_pretrained(model, out_dir / "patched")
    tok.save_pretrained(out_dir / "patched")

    check = logit_comparison(reference, result.logits)
    summary = {
        "model": bundle.name, "model_type": model.config.model_type, "prompt": prompt, "variant": variant,
        "loop": patcher.variant.loop, "evidence": patcher.variant.evidence,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "context_ids": ids[0, :-1].tolist(), "query_id": int(query),
        "reference_top1": int(reference.argmax()), "control_top1": int(control.argmax()),
        "next_token_with_context": tok.decode([int(reference.argmax())]),
        "next_token_without_context": tok.decode([int(control.argmax())]),
        "logit_linf_at_export": check["logit_linf"], "top1_match_at_export": bool(check["top1_match"]),
        "div_zero": result.div_zero, "no_root": result.no_root,
        "has_base": bundle.is_random,
    }
    write_json_atomic(out_dir / "inputs.json", summary)
    summary["reference_logits"] = reference  # not in inputs.json: for the caller's own check
    summary["control_logits"] = control
    return summary
