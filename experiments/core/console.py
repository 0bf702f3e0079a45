"""What the terminal shows: log lines without the timestamp/module prefix (the run's log file keeps
them), warnings and errors marked as such, and never a path hard-wrapped (pipes included)."""

from __future__ import annotations

import logging

from rich.console import Console


class ConsoleFormatter(logging.Formatter):
    """`message` for info, `warning: message` / `error: message` above it (conf/config.yaml wires it
    into Hydra's job logging for the console handler)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        if record.levelno >= logging.WARNING:
            return f"warning: {text}"
        return text


def plain_console(stderr: bool = False) -> Console:
    """A rich Console that never hard-wraps: soft wrapping on a terminal, no width limit in a pipe."""
    return Console(stderr=stderr, soft_wrap=True, highlight=False)
