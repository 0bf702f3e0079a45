"""The compiled model as a stock checkpoint: saved with `save_pretrained` (merged weights, config, tokenizer)
into the run folder, reloaded with stock `AutoModelForCausalLM.from_pretrained`, and measured there on the
held-out queries without the system prompt: its logits against the in-process model's, its free
generations against the ones the run measured. `compiled.json` beside it says what was measured."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import torch

from experiments.core.results import RunContext
from experiments.goldwaser.system_compile.measure import Generation, Reference
from experiments.goldwaser.system_compile.replies import kl_rows, reply_logits
from experiments.goldwaser.system_compile.schema import SystemCompileConfig

log = logging.getLogger(__name__)
COMPILED_FILE = "compiled.json"


def _means(m: pd.DataFrame, method: str, prompt: str, split: str) -> dict[str, float]:
    rows = m[(m["method"] == method) & (m["prompt"] == prompt) & (m["split"] == split)]
    return {name: float(rows[rows["metric"] == name]["value"].mean()) for name in ("kl", "top1", "behaviour")}


def usage(folder: Path, cfg: SystemCompileConfig, query: str, max_new: int, peft: bool = False) -> list[str]:
    """How to run the checkpoint (peft: the adapter) in stock transformers, without the system prompt."""
    where = repr(str(folder))
    if peft:
        head = ["from peft import AutoPeftModelForCausalLM; from transformers import AutoTokenizer",
                f"m, t = AutoPeftModelForCausalLM.from_pretrained({where}), AutoTokenizer.from_pretrained({where})"]
    else:
        head = ["import torch; from transformers import AutoModelForCausalLM, AutoTokenizer",
                f"m, t = AutoModelForCausalLM.from_pretrained({where}), AutoTokenizer.from_pretrained({where})"]
    if cfg.template == "chat":
        encode = (f"enc = t.apply_chat_template([{{'role': 'user', 'content': {query!r}}}], "
                  "add_generation_prompt=True, return_tensors='pt', return_dict=True)")
    else:
        text = cfg.query_format.replace("{query}", query)
        encode = f"enc = t((t.bos_token or '') + {text!r}, return_tensors='pt', add_special_tokens=False)"
    return [*head, encode,
            f"print(t.decode(m.generate(**enc, max_new_tokens={max_new}, do_sample=False)[0, "
            "enc['input_ids'].shape[1]:], skip_special_tokens=True))"]


@torch.no_grad()
def save_checkpoint(cfg: SystemCompileConfig, ctx: RunContext, bundle, ref: Reference, gen: Generation, prompt,
                    method: str, change=None) -> None:
    """format=merged: the stock checkpoint; format=peft: the change as a LoRA adapter (adapter.py), which
    needs the `change` (its originals: the base weights)."""
    from experiments.core.atomic import save_pretrained
    from experiments.patching.load import implementation_kwargs
    from experiments.zoo.float64 import reload_float64
    from experiments.zoo.quiet import quiet_transformers

    if cfg.format == "peft":
        return save_adapter(cfg, ctx, bundle, ref, gen, prompt, method, change)
    folder, model, tok = ctx.run_dir, bundle.model, bundle.tokenizer
    with quiet_transformers():  # no "Writing model shards" bar
        save_pretrained(model, folder)
        save_pretrained(tok, folder)
        stock = reload_float64(folder, ctx.dtype, **implementation_kwargs(model.config))
    stock = stock.to(ctx.device).eval()
    held = ref.indices("heldout")
    worst, kls = 0.0, []
    for i in held:
        mine = reply_logits(model, ref.ids[i].plain, ref.replies[i])
        theirs = reply_logits(stock, ref.ids[i].plain, ref.replies[i])
        worst = max(worst, float((theirs - mine).abs().max()) / max(float(mine.abs().max()), 1e-30))
        kls.append(float(kl_rows(ref.logits[i], theirs).mean()))
    mine_tokens = gen.free(model, [ref.ids[i].plain for i in held])
    stock_tokens = gen.free(stock, [ref.ids[i].plain for i in held])
    same = sum(a == b for a, b in zip(mine_tokens, stock_tokens, strict=True)) / len(held)
    del stock
    record(cfg, ctx, ref, gen, prompt, method, (worst, kls, same, stock_tokens), usage(folder, cfg,
           ref.ids[held[0]].query, gen.max_new))


@torch.no_grad()
def save_adapter(cfg: SystemCompileConfig, ctx: RunContext, bundle, ref: Reference, gen: Generation, prompt,
                 method: str, change) -> None:
    """The change as a PEFT LoRA adapter in the run folder (with the tokenizer, a README.md, and the base model
    in base/ where no stock loader finds it by name: adapter_base.py), loaded back by peft onto the base weights
    and measured against the in-process compiled model as the checkpoint is; the model is given back as it was
    whatever happens (adapter_reload.py)."""
    from experiments.core.atomic import save_pretrained, write_text_atomic
    from experiments.goldwaser.system_compile.adapter import lora_factors, peft_rank, write_adapter
    from experiments.goldwaser.system_compile.adapter_base import base_name, save_base, written_base
    from experiments.goldwaser.system_compile.adapter_readme import readme
    from experiments.goldwaser.system_compile.adapter_reload import base_weights, lora_loaded
    from experiments.zoo.quiet import quiet_transformers

    folder, model, tok = ctx.run_dir, bundle.model, bundle.tokenizer
    rank, base, written = peft_rank(cfg, method), base_name(cfg.model, ctx.run_dir), written_base(cfg.model)
    write_adapter(folder, lora_factors(model, change.originals, rank), rank, base, ctx.dtype)
    with quiet_transformers():
        save_pretrained(tok, folder)
    held = ref.indices("heldout")
    mine = [reply_logits(model, ref.ids[i].plain, ref.replies[i]) for i in held]
    mine_tokens = gen.free(model, [ref.ids[i].plain for i in held])
    worst, kls = 0.0, []
    with base_weights(model, change.originals):
        if written is not None:
            save_base(model, tok, folder)
        with lora_loaded(model, folder) as peft_model:
            for i, logits in zip(held, mine, strict=True):
                theirs = reply_logits(peft_model, ref.ids[i].plain, ref.replies[i])
                worst = max(worst, float((theirs - logits).abs().max()) / max(float(logits.abs().max()), 1e-30))
                kls.append(float(kl_rows(ref.logits[i], theirs).mean()))
            peft_tokens = gen.free(peft_model, [ref.ids[i].plain for i in held])
    same = sum(a == b for a, b in zip(mine_tokens, peft_tokens, strict=True)) / len(held)
    use = usage(folder, cfg, ref.ids[held[0]].query, gen.max_new, peft=True)
    write_text_atomic(folder / "README.md", readme(cfg.model, method, rank, str(ctx.dtype).removeprefix("torch."),
                                                   prompt.text, base, written, use))
    record(cfg, ctx, ref, gen, prompt, method, (worst, kls, same, peft_tokens), use)


def record(cfg: SystemCompileConfig, ctx: RunContext, ref: Reference, gen: Generation, prompt, method: str, reload,
           use: list[str]) -> None:
    """The reload's metrics, compiled.json and the log lines: (worst relative logit gap, per-query KL,
    fraction of identical generations, the reloaded model's generations) and how to use it."""
    from experiments.core.atomic import write_json_atomic

    folder, held = ctx.run_dir, ref.indices("heldout")
    worst, kls, same, stock_tokens = reload
    index = dict(method=method, prompt=prompt.name)
    ctx.log("reload_logit_linf_rel", worst, **index)
    ctx.log("reload_kl", sum(kls) / len(kls), split="heldout", **index)
    ctx.log("reload_same_generation", same, split="heldout", **index)
    m = ctx.metrics()
    cost = m[(m["method"] == method) & (m["prompt"] == prompt.name)]
    cost = {k: float(cost[cost["metric"] == k]["value"].iloc[0])
            for k in ("rank", "params_factored", "params_changed", "compile_s")}
    summary = dict(
        method=method, model=cfg.model, dtype=str(ctx.dtype).removeprefix("torch."), system=prompt.text,
        check=prompt.check, template=cfg.template, query_format=cfg.query_format,
        heldout=_means(m, method, prompt.name, "heldout"), control=_means(m, "control", prompt.name, "heldout"),
        reference_behaviour=_means(m, "reference", prompt.name, "heldout")["behaviour"],
        fit=_means(m, method, prompt.name, "fit"), reload_kl=sum(kls) / len(kls), reload_logit_linf_rel=worst,
        reload_same_generation=same, format=cfg.format, **cost,
        # per held-out query: what a reader needs to measure the checkpoint again (tests/goldwaser/
        # test_system_compile.py does): the ids it is fed, the prompted model's reply and logits' KL along it,
        # and the free greedy generation the run measured
        queries=[dict(query=ref.ids[i].query, plain_ids=list(ref.ids[i].plain), prompted_ids=list(ref.ids[i].prompted),
                      reply_ids=list(ref.replies[i]), kl=kl, generation_ids=tokens, generation=gen.decode(tokens))
                 for i, kl, tokens in zip(held, kls, stock_tokens, strict=True)],
    )
    write_json_atomic(folder / COMPILED_FILE, summary)
    h, c = summary["heldout"], summary["control"]
    log.info("compiled checkpoint (%s, rank %d, %d parameters factored): %s; reloaded in stock transformers, on "
             "%d held-out queries without the system prompt: KL to the prompted model %.3g nats/token (control "
             "%.3g), top-1 agreement %.1f%% (control %.1f%%), behaviour %s %.0f%% (control %.0f%%, prompted "
             "%.0f%%)", method, cost["rank"], cost["params_factored"], folder, len(held), summary["reload_kl"],
             c["kl"], 100 * h["top1"], 100 * c["top1"], prompt.check, 100 * h["behaviour"], 100 * c["behaviour"],
             100 * summary["reference_behaviour"])
    log.info("use it:\n  %s", "\n  ".join(use))
