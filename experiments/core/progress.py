"""Progress for long loops: a rich bar on a terminal, plain log lines otherwise (cluster logs,
CI, pipes), so a SLURM .out file stays readable."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger("icl_exp.progress")


class _Bar:
    def __init__(self, total: int, description: str, fancy: bool):
        self.total, self.description, self.done = total, description, 0
        self._fancy = fancy
        self._next_log_at = 0.0
        self._start = time.perf_counter()
        self._progress: Progress | None = None
        self._task = None
        self.info = ""

    def __enter__(self) -> _Bar:
        if self._fancy:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, info="")
        return self

    def advance(self, n: int = 1, info: str | None = None) -> None:
        self.done += n
        if info is not None:
            self.info = info
        if self._progress is not None:
            self._progress.update(self._task, advance=n, info=self.info)
            return
        # Plain mode: a line every 10% (and at the end).
        frac = self.done / max(self.total, 1)
        if frac >= self._next_log_at or self.done >= self.total:
            elapsed = time.perf_counter() - self._start
            log.info("%s: %d/%d (%.0f%%) %.1fs %s", self.description, self.done, self.total,
                     100 * frac, elapsed, self.info)
            self._next_log_at = frac + 0.1

    def __exit__(self, *_exc) -> None:
        if self._progress is not None:
            self._progress.stop()


def fancy_enabled() -> bool:
    return sys.stderr.isatty()


@contextmanager
def progress(total: int, description: str) -> Iterator[_Bar]:
    """`with progress(n, "train") as bar: ... bar.advance(1, info=f"loss {l:.3g}")`"""
    with _Bar(total, description, fancy_enabled()) as bar:
        yield bar
