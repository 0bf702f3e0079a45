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
