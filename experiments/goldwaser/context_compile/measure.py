"""context_compile's measurement for one prompt: the reply with the context, the targets, the fixed patch
for every k, the control, the per-token patch, and (first prompt) the checkpoint reloaded in stock
transformers. See run.py for the design; the maths is in experiments/patching/fixed_patch.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch import Tensor

from experiments.core.errors import UserError
from experiments.core.results import RunContext
from experiments.goldwaser.context_compile import ContextCompileConfig
from experiments.patching.compare import comparable, logit_comparison

log = logging.getLogger(__name__)
COMPILED_FILE = "compiled.json"  # beside the checkpoint: prompt, k, start token, measured agreement
REPLIES_FILE = "replies.json"
PERTURB = 1.01  # the perturbed fit: every fitted change ×1.01


def sweep_ks(cfg: ContextCompileConfig) -> list[int]:
    """The k of the checkpoint and the sweep's (a list of integers: the schema's), sorted, each once."""
    return sorted({cfg.k, *cfg.sweep})


def start_token(tokenizer, prompt_ids) -> int:
    """What the compiled model is fed instead of the prompt: BOS, or (no BOS) the prompt's last token."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return int(bos) if bos is not None else int(prompt_ids[0, -1])


def reply_with_context(model, inputs: dict, max_new: int, stop_ids: set[int],
                       per_token: bool) -> tuple[list[int], Tensor | None, Tensor]:
    """The model's greedy reply to the prompt, KV-cached, and its cached logits at every step (steps, V); with
    `per_token`, also the per-token patched logits at every step (`patcher.Patcher` with the family's exact
    open loop, `variants.export_default`: the upper bound), (steps, V)."""
    from experiments.patching.arch import adapter_for
    from experiments.patching.generate import compare_generation, greedy
    from experiments.patching.patcher import Patcher
    from experiments.patching.variants import export_default

    patcher = Patcher(model, export_default(adapter_for(model.config.model_type)))
    if per_token:
        tokens, logits, cached = [], [], []
        for st in compare_generation(patcher, inputs, max_new, greedy, stop_ids, control=False):
            tokens.append(st.token_id)
            logits.append(st.patched.logits)
            cached.append(st.context)
        return tokens, torch.stack(logits), torch.stack(cached)
    ids = inputs["input_ids"]
    cache, query = patcher.start({"input_ids": ids})
    tokens, cached = [], []
    for _ in range(max_new):
        step = patcher.context_step({"input_ids": query}, cache)
        cache = step.cache
        cached.append(step.logits)
        tokens.append(int(step.logits.argmax()))
        if tokens[-1] in stop_ids:
            break
        query = torch.tensor([[tokens[-1]]], device=ids.device)
    return tokens, None, torch.stack(cached)


def require_positions(k: int, generated: int, prompt: int) -> None:
    """The fit needs k positions of the reply: one line with the limit when the reply is shorter."""
    if k > generated:
        raise UserError(f"k={k} is more than the positions generated: prompt {prompt}'s reply ended after "
                        f"{generated} tokens (k ≤ {generated}); use a smaller k or sweep=, a prompt with a longer "
                        "reply, or stop_at_eos=false")


def log_positions(ctx: RunContext, reference: Tensor, got: Tensor, method: str, positions, **index) -> None:
    from experiments.patching.compare import logit_comparison

    for i in positions:
        ctx.log_many(logit_comparison(reference[i], got[i]), position=i, method=method, **index)


@torch.no_grad()
def compile_prompt(cfg: ContextCompileConfig, ctx: RunContext, bundle, p: int, text: str, stop_ids: set[int],
                   save_to: Path | None) -> None:
    from experiments.core.atomic import write_json_atomic
    from experiments.core.runtime import dtype_name
    from experiments.goldwaser.common import check_context_length
    from experiments.patching.arch import adapter_for
    from experiments.patching.fixed_patch import capture_targets, fit_fixed_patch, layer_outputs
    from experiments.zoo.prompts import encode_prompt

    model, tok = bundle.model, bundle.tokenizer
    adapter = adapter_for(model.config.model_type)
    inputs = encode_prompt(bundle, text, None, cfg.chat_template, ctx.device)
    prompt_ids = inputs["input_ids"]
    P = prompt_ids.shape[1]
    ks, n_held = sweep_ks(cfg), cfg.heldout
    check_context_length(model.config, [P], ks[-1] + n_held)
    t0 = time.perf_counter()
    reply, per_token, cached = reply_with_context(model, inputs, ks[-1] + n_held, stop_ids, cfg.per_token)
    G = len(reply)
    reply_s = time.perf_counter() - t0
    require_positions(ks[-1], G, p)
    dev = ctx.device
    full = torch.cat([prompt_ids, torch.tensor([reply[:-1]], device=dev, dtype=prompt_ids.dtype)], 1)
    start = start_token(tok, prompt_ids)
    nc = torch.tensor([[start, *reply[:-1]]], device=dev)  # the no-context sequence: position i predicts reply[i]
    reference, targets = capture_targets(model, adapter, full, P - 1, ks[-1])
    index = dict(model=cfg.model, model_type=model.config.model_type, family=adapter.family,
                 dtype=dtype_name(ctx.dtype), prompt=p)
    ctx.log("reply_s", reply_s, tokens=G, **index)  # generation with the prompt (+ the per-token patch)
    control, _ = layer_outputs(model, adapter, nc)
    log_positions(ctx, reference, control, "control", range(G), **index)
    # the reply's KV-cached logits (what the reply was generated by) against the uncached reference forward of
    # the prompt and reply that every fit is judged by: a cache or prompt gone wrong shows here
    for i in range(G):
        ctx.log("cached_vs_uncached_logit_linf_rel",
                logit_comparison(reference[i], cached[i])["logit_linf_rel"], position=i, **index)
    if per_token is not None:
        log_positions(ctx, reference, per_token, "per_token", range(G), **index)
    for k in ks:
        t0 = time.perf_counter()
        patch = fit_fixed_patch(model, adapter, nc[:, :k], targets.first(k))
        ctx.log("fit_s", time.perf_counter() - t0, k=k, **index)
        try:
            logits, outs = layer_outputs(model, adapter, nc)
            for i in range(G):
                log_positions(ctx, reference, logits, "fixed", [i], k=k, fitted=int(i < k), **index)
            for fit in patch.layers:
                want = targets.out[fit.layer][:k]
                err = float((outs[fit.layer][:k] - want).abs().max()) / max(float(want.abs().max()), 1e-300)
                ctx.log_many(dict(rank=fit.rank, input_rel=fit.input_rel, output_residual=fit.output_residual,
                                  r_norm=fit.r_norm, output_delta_linf=fit.output_delta_linf, hidden_rel=err),
                             layer=fit.layer, k=k, **index)
            # the fitted positions alone, the fit's own shape: exact here but not in the full sequence means
            # the patched model amplifies the last bits (e.g. a scale's Δm = r ⊘ h with small h)
            alone = comparable(model(input_ids=nc[:, :k], use_cache=False).logits[0])
            log_positions(ctx, reference, alone, "fixed_fit_shape", range(k), k=k, fitted=1, **index)
            fitted = patch.scaled(model, PERTURB)  # the control of the exactness check
            perturbed = comparable(model(input_ids=nc[:, :k], use_cache=False).logits[0])
            for name, t in fitted.items():
                model.get_parameter(name).data.copy_(t)
            log_positions(ctx, reference, perturbed, "perturbed", range(k), k=k, fitted=1, **index)
            if save_to is not None and k == cfg.k:
                t0 = time.perf_counter()
                save_checkpoint(cfg, ctx, bundle, Path(save_to), nc, reference, reply, start, text, index)
                ctx.log("checkpoint_s", time.perf_counter() - t0, k=k, **index)  # save, reload, measure
        finally:
            patch.restore(model)
    replies = _read_json(ctx.path(REPLIES_FILE))
    replies.append(dict(prompt=text, reply=tok.decode(reply), reply_ids=reply, start_id=start))
    write_json_atomic(ctx.path(REPLIES_FILE), replies)


def _read_json(path: Path) -> list:
    import json

    return json.loads(path.read_text()) if path.is_file() else []


@torch.no_grad()
def save_checkpoint(cfg: ContextCompileConfig, ctx: RunContext, bundle, folder: Path, nc: Tensor, reference: Tensor,
                    reply: list[int], start: int, text: str, index: dict) -> None:
    """Save the patched model with `save_pretrained` (safetensors, config, tokenizer), reload it with stock
    `AutoModelForCausalLM.from_pretrained` and measure it there: teacher-forced agreement at every position,
    and a free-running greedy generation from the start token alone against the reply."""
    from experiments.core.atomic import save_pretrained, write_json_atomic
    from experiments.patching.compare import logit_comparison
    from experiments.patching.load import implementation_kwargs
    from experiments.zoo.float64 import reload_float64
    from experiments.zoo.quiet import quiet_transformers

    tok, k, G = bundle.tokenizer, cfg.k, len(reply)
    with quiet_transformers():  # no "Writing model shards" bar
        save_pretrained(bundle.model, folder)
        save_pretrained(tok, folder)
        stock = reload_float64(folder, ctx.dtype, **implementation_kwargs(bundle.model.config))
    stock = stock.to(ctx.device).eval()
    logits = comparable(stock(input_ids=nc, use_cache=False).logits[0])
    rows = [logit_comparison(reference[i], logits[i]) for i in range(G)]
    for i, row in enumerate(rows):
        ctx.log_many({f"reload_{m}": v for m, v in row.items()}, position=i, k=k, fitted=int(i < k), **index)
    start_ids = torch.tensor([[start]], device=ctx.device)
    out = stock.generate(start_ids, attention_mask=torch.ones_like(start_ids), max_new_tokens=G, do_sample=False,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else start)[0, 1:].tolist()
    prefix = next((i for i, (a, b) in enumerate(zip(out, reply, strict=False)) if a != b), min(len(out), G))
    ctx.log("free_run_prefix", prefix, k=k, **index)
    held = rows[k:k + cfg.heldout]
    summary = dict(
        model=cfg.model, prompt=text, k=k, start_id=start, dtype=index["dtype"],
        fitted_top1=sum(r["top1_match"] for r in rows[:k]) / k,
        heldout_top1=sum(r["top1_match"] for r in held) / len(held) if held else None, heldout=len(held),
        fitted_max_logit_linf_rel=max(r["logit_linf_rel"] for r in rows[:k]),
        free_run_prefix=prefix, reply=tok.decode(reply), compiled_reply=tok.decode(out),
    )
    write_json_atomic(folder / "compiled.json", summary)
    held_text = f"{summary['heldout_top1']:.1%} at the {len(held)} after" if held else "no held-out positions"
    log.info("compiled checkpoint: %s (k=%d); reloaded in stock transformers: top-1 agreement with the model "
             "given the prompt %.1f%% at the %d fitted positions, %s; free-running greedy generation from "
             "token %d alone matches the first %d of %d reply tokens", folder, k, 100 * summary["fitted_top1"], k,
             held_text, start, prefix, G)
    log.info("use it:\n  import torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
             "  m, t = AutoModelForCausalLM.from_pretrained(%r), AutoTokenizer.from_pretrained(%r)\n"
             "  print(t.decode(m.generate(torch.tensor([[%d]]), max_new_tokens=%d, do_sample=False)[0, 1:]))",
             str(folder), str(folder), start, G)
