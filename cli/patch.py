"""`icl-exp patch export model=... prompt=... out=DIR`: a checkpoint with a prompt's context in its weights.

The options are Hydra overrides of patch_export's config (PatchExportConfig in experiments/goldwaser/patch_export/),
composed and validated exactly as `icl-exp run patch_export ...` (which this is); out=DIR is the run folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer

from experiments.patching.families import post_norm_names, tiny_models

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Patched checkpoints: a prompt's context moved into the weights (Goldwaser et al.).")

# One line per paragraph (rich wraps them; a hard break would stay mid-sentence), and no square
# brackets: rich reads `[prompt=TEXT]` as markup and drops it. The families come from the torch-free family
# table (experiments/patching/families.py), so `--help` stays quick and a new family is listed with no edit here.
_POST_NORM = " and ".join(post_norm_names())
EXPORT_HELP = "\n\n".join([
    "Patch MODEL for the last token of PROMPT and write OUT/patched (a stock Hugging Face checkpoint), "
    "OUT/base (the original, for random models), OUT/inputs.json (the context and query token ids) and "
    "OUT/run.json.",
    "Keys, as key=value (Hydra overrides; `icl-exp run patch_export --cfg job` prints them all):",
    "model=ID, a local folder, or an offline model: gemma-3-270m, qwen2.5-0.5b (trained), "
    f"{', '.join(tiny_models())} (default tiny-gemma3)",
    "prompt=TEXT, the prompt whose context goes into the weights (default: the paper's Mars forecast prompt)",
    "out=DIR, the run folder (default results/patch_export/STAMP)",
    f"variant=naive, conditioned, stable (post-norm blocks: {', '.join(post_norm_names())}), closed_loop (default: "
    f"an open loop exact on the family, conditioned on {_POST_NORM}, naive on Llama-style blocks: evidence; the "
    "closed loop only where none is, GPT-2: a construction)",
    "dtype=float32, device=cpu, seed=0, chat_template=true (wrap the prompt in the model's chat template)",
    "Example: icl-exp patch export model=tiny-llama prompt=\"Write a haiku about snow.\" out=snow",
])


@app.command("export", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             help=EXPORT_HELP)
def export(ctx: typer.Context) -> None:
    """Run patch_export with these overrides (the help text is EXPORT_HELP), then say how to use what it wrote."""
    from cli.launch import launch

    out = launch("patch_export", list(ctx.args), multirun=False)
    if out is not None and (out / "inputs.json").is_file():
        from experiments.core.console import plain_console

        console = plain_console()
        for line in usage_snippet(out):
            console.print(line)


def usage_snippet(out: Path) -> list[str]:
    """How to use the export: stock transformers, fed the query token alone (the context is in the weights)."""
    out = out.absolute()
    inputs = json.loads((out / "inputs.json").read_text())
    query_id = inputs["query_id"]
    kind = ("the paper's open loop: evidence for Thm 1" if inputs.get("evidence")
            else "the closed loop: a construction, exact by design")
    return [
        f"patched by variant={inputs.get('variant')} ({kind})",
        f"use it: fed the prompt's last token alone (id {query_id}, in inputs.json), the patched model gives "
        f"the original model's next-token logits after the whole prompt:",
        "  import torch; from transformers import AutoModelForCausalLM",
        f"  model = AutoModelForCausalLM.from_pretrained({str(out / 'patched')!r})",
        f"  logits = model(input_ids=torch.tensor([[{query_id}]])).logits[0, -1]",
    ]


@app.command("compile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compile_(ctx: typer.Context) -> None:
    """Compile a prompt into fixed weights and save them as a stock checkpoint in OUT
    (`AutoModelForCausalLM.from_pretrained(OUT)` runs without the prompt); prints what was measured by
    reloading OUT, and how to use it.

    Without method=: PROMPT's own reply (context_compile): one change per layer fitted at the first K positions
    of the model's reply. Keys (Hydra overrides of context_compile's config: `icl-exp run context_compile --cfg job`
    prints them all): model=ID|PATH|gemma-3-270m|qwen2.5-0.5b|tiny-llama|... prompt=TEXT; optional: k=16,
    heldout=32, per_token=false, dtype=float32, out=DIR (a new or empty folder), sweep=[] (more k to measure).

    With method=analytic|bake: a SYSTEM prompt for queries it never saw (system_compile): the analytic fixed patch
    or a baked LoRA (merged), fitted on the fit queries and measured on the held-out ones. Keys (system_compile's,
    `icl-exp run system_compile --cfg job`): model=ID|PATH|qwen2.5-0.5b|gemma-3-270m|tiny-llama|...
    system=TEXT check=french|language:CODE|starts_with:WORD|ends_with:WORD|uppercase|json|no_letter:L|
    one_sentence|recalls:TEXT [queries=[...] heldout=16] [template=chat|prefix] [rank=8 steps=60 (bake)]
    [analytic_rank=R] [format=merged|peft: a stock checkpoint, or a PEFT LoRA adapter (analytic: needs
    analytic_rank=R)] [out=DIR: a new or empty folder].
    """
    from cli.launch import launch
    from cli.output import fail

    outs = [a.split("=", 1)[1] for a in ctx.args if a.startswith("out=")]
    if outs and Path(outs[-1]).expanduser().is_dir() and any(Path(outs[-1]).expanduser().iterdir()):
        fail(f"out={outs[-1]} exists and is not empty; nothing was written (give a new or empty folder)")
    overrides = [f"hydra.run.dir={a.split('=', 1)[1]}" if a.startswith("out=") else a for a in ctx.args]
    methods = [a.split("=", 1)[1] for a in ctx.args if a.startswith("method=")]
    if methods:
        launch("system_compile", system_compile_overrides(methods[-1], overrides), multirun=False)
        return
    defaults = [d for d in ("sweep=[]", "prompts=[]", "per_token=false")  # one prompt, one k: the artifact
                if not any(a.startswith(d.split("=")[0] + "=") for a in ctx.args)]
    launch("context_compile", [*defaults, *overrides], multirun=False)


def _system_methods() -> tuple[str, ...]:
    """system_compile's methods, from its schema's Enum (no torch behind that import)."""
    from experiments.goldwaser.system_compile.schema import Method

    return tuple(m.value for m in Method)


def system_compile_overrides(method: str, overrides: list[str]) -> list[str]:
    """`patch compile method=M system=TEXT ...` as system_compile's overrides: that one method, its checkpoint
    kept in the run folder; one line when the method or the system prompt is missing."""
    from cli.output import fail

    if method not in _system_methods():
        fail(f"method={method} is not one of {', '.join(_system_methods())}")
    if not any(a.startswith("system=") for a in overrides):
        from experiments.goldwaser.system_compile.behaviours import CHECK_FORMS

        fail(f"patch compile method=... compiles one system prompt: give system=TEXT and check={'|'.join(CHECK_FORMS)}")
    rest = [hydra_quoted(a) if a.startswith(("system=", "check=")) else a
            for a in overrides if not a.startswith("method=")]
    return [f"methods=[{method}]", f"save={method}", *rest]


def hydra_quoted(override: str) -> str:
    """KEY=TEXT with TEXT as one quoted Hydra string, so a system prompt may hold quotes, commas, brackets or
    `${`: backslashes before a quote doubled, the quote escaped, `${` escaped (no interpolation). A value the
    user quoted already is left alone."""
    key, text = override.split("=", 1)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return override
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text).replace("${", "\\${")
    return f"{key}='{text}'"
