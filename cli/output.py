"""What every command prints on failure, and the run folder's name: shared by the commands and the
launcher, so neither has to import the other."""

from __future__ import annotations

import secrets
from datetime import datetime

import typer
from rich.console import Console

err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    from rich.markup import escape

    # escaped: `pip install -e '.[joblib]'` and `[a,b]` are text, not rich markup
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def unique_stamp() -> str:
    """Timestamp plus a random suffix: two runs started in the same second get two folders."""
    return f"{datetime.now():%Y-%m-%d_%H-%M-%S}-{secrets.token_hex(3)}"
