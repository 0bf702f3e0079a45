"""`icl-exp patch export model=... [prompt=...] [out=DIR]`: a checkpoint with a prompt's context in its weights.

The options are Hydra overrides of conf/experiment/patch_export.yaml, composed and validated exactly as
`icl-exp run patch_export ...` (which this is), with out=DIR as a shorthand for the run folder.
"""

from __future__ import annotations

from types import SimpleNamespace

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Patched checkpoints: a prompt's context moved into the weights (Goldwaser et al.).")


@app.command("export", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def export(ctx: typer.Context) -> None:
    """Patch MODEL for PROMPT's last token and write OUT/patched (a Hugging Face checkpoint), OUT/base
    (random models), OUT/inputs.json and OUT/run.json.

    Keys (Hydra overrides): model=ID|PATH|tiny-llama|... [prompt=TEXT] [variant=closed_loop|naive|stable]
    [dtype=float32] [device=cpu] [seed=0] [chat_template=true] [out=DIR (default results/patch_export/...)].
    """
    from cli.main import run

    overrides = [f"hydra.run.dir={a.split('=', 1)[1]}" if a.startswith("out=") else a for a in ctx.args]
    run(SimpleNamespace(args=overrides), "patch_export", multirun=False)


@app.command("compile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compile_(ctx: typer.Context) -> None:
    """Compile PROMPT into fixed weights: one change per layer fitted at the first K positions of the
    model's own reply, saved as a stock checkpoint in OUT (`AutoModelForCausalLM.from_pretrained(OUT)`
    generates without the prompt); prints the agreement measured by reloading OUT, and how to use it.

    Keys (Hydra overrides of conf/experiment/context_compile.yaml): model=ID|PATH|gemma-3-270m|tiny-llama|...
    prompt=TEXT [k=16] [heldout=32] [sweep=[] (more k to measure)] [per_token=false] [dtype=float32]
    [out=DIR: a new or empty folder].
    """
    from pathlib import Path

    from cli.main import fail, run

    outs = [a.split("=", 1)[1] for a in ctx.args if a.startswith("out=")]
    if outs and Path(outs[-1]).expanduser().is_dir() and any(Path(outs[-1]).expanduser().iterdir()):
        fail(f"out={outs[-1]} exists and is not empty; nothing was written (give a new or empty folder)")
    defaults = [d for d in ("sweep=[]", "prompts=[]", "per_token=false")  # one prompt, one k: the artifact
                if not any(a.startswith(d.split("=")[0] + "=") for a in ctx.args)]
    overrides = [f"hydra.run.dir={a.split('=', 1)[1]}" if a.startswith("out=") else a for a in ctx.args]
    run(SimpleNamespace(args=[*defaults, *overrides]), "context_compile", multirun=False)
