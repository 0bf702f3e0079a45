"""`icl-exp patch export model=... [prompt=...] out=DIR`: a checkpoint with a prompt's context in its weights."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Patched checkpoints: a prompt's context moved into the weights (Goldwaser et al.).")
err_console = Console(stderr=True)

EXPORT_KEYS = {"model": None, "out": None, "prompt": None, "variant": "naive", "dtype": "float32",
               "device": "cpu", "seed": "0", "chat_template": "true"}
REQUIRED = ("model", "out")


def fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def parse_key_values(args: list[str], allowed: dict[str, str | None]) -> dict[str, str]:
    """`key=value` words (Hydra-style, as `icl-exp run` takes them) into a dict with defaults."""
    from experiments.core.errors import UserError

    values: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise UserError(f"expected key=value, got {arg!r} (keys: {', '.join(allowed)})")
        if key not in allowed:
            raise UserError(f"unknown key {key!r} (keys: {', '.join(allowed)})")
        values[key] = value
    missing = [k for k in REQUIRED if k in allowed and not values.get(k)]
    if missing:
        raise UserError(f"missing {' and '.join(f'{k}=...' for k in missing)}")
    return {k: values.get(k, default) for k, default in allowed.items()}


def _bool(key: str, value: str) -> bool:
    from experiments.core.errors import UserError

    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise UserError(f"{key}={value!r} is ill-typed: expected true or false")


@app.command("export", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def export(ctx: typer.Context) -> None:
    """Patch MODEL for PROMPT's last token and write OUT/patched (a Hugging Face checkpoint), OUT/base
    (random models) and OUT/inputs.json.

    Keys: model=ID|PATH|tiny-gemma3 out=DIR [prompt=TEXT] [variant=naive|stable] [dtype=float32]
    [device=cpu] [seed=0] [chat_template=true].
    """
    from experiments.core.errors import UserError

    try:
        opts = parse_key_values(list(ctx.args), EXPORT_KEYS)
        summary = _export(opts)
    except UserError as err:
        fail(str(err))
    Console().print(
        f"wrote {opts['out']}/patched ({summary['variant']}, {summary['dtype']}): fed token {summary['query_id']} "
        f"alone it gives the next-token logits of the whole prompt to L∞ {summary['logit_linf_at_export']:.3g} "
        f"(top-1 {'same' if summary['top1_match_at_export'] else 'DIFFERENT'})", highlight=False)


def _export(opts: dict[str, str]) -> dict:
    from experiments.core.errors import UserError
    from experiments.core.runtime import resolve_device, resolve_dtype
    from experiments.goldwaser.gemma_models import load_gemma, threads_for
    from experiments.patching.gemma3 import VARIANTS
    from experiments.patching.gemma3_export import PAPER_PROMPT, export_patched

    if opts["variant"] not in VARIANTS:
        raise UserError(f"variant={opts['variant']!r} is not one of {', '.join(VARIANTS)}")
    try:
        seed = int(opts["seed"])
    except ValueError:
        raise UserError(f"seed={opts['seed']!r} is ill-typed: expected an integer") from None
    dtype, device = resolve_dtype(opts["dtype"]), resolve_device(opts["device"])
    chat = _bool("chat_template", opts["chat_template"])
    out = Path(opts["out"]).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"out={out} exists and is not an empty folder; choose another")
    bundle = load_gemma(opts["model"], dtype, device, seed=seed)
    with threads_for(bundle.model):
        return export_patched(bundle, opts["prompt"] or PAPER_PROMPT, out, opts["variant"], chat)
