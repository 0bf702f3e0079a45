"""Progress for long loops: a rich bar with ETA on a terminal, one line per loop; plain and quiet
otherwise (pipes, CI, cluster logs, parallel sweep workers): a line with the ETA at most once a
minute while the loop runs, and one line when it ends, so a SLURM .out file stays readable."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger("icl_exp.progress")

PLAIN_EVERY_S = 60.0  # piped output: at most one line a minute per loop (plus the final one)

# The loops running now, innermost last, so an interrupted or failed run can record in run.json
# how far it got ("train 1200/4000").
_running: list[_Bar] = []
_last_stopped: str | None = None  # the innermost loop an exception left, kept for the runner


def last_progress() -> str | None:
    """Where the innermost loop stood: running now, or where an exception stopped it."""
    if _running:
        return _running[-1].position()
    return _last_stopped


def reset() -> None:
    """Forget finished loops (a new run starts; a sweep runs several in one process)."""
    global _last_stopped
    _running.clear()
    _last_stopped = None


def _eta(elapsed: float, done: int, total: int) -> str:
    if done <= 0 or done >= total:
        return ""
    return f", about {_duration(elapsed / done * (total - done))} left"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Bar:
    def __init__(self, total: int, description: str, fancy: bool):
        self.total, self.description, self.done = total, description, 0
        self._fancy = fancy
        self._start = time.perf_counter()
        self._last_line = self._start
        self._progress: Progress | None = None
        self._task = None
        self.info = ""

    def position(self) -> str:
        return f"{self.description} {self.done}/{self.total}"

    def __enter__(self) -> _Bar:
        _running.append(self)
        if self._fancy:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=Console(stderr=True), transient=False, redirect_stdout=False, redirect_stderr=False,
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
        now = time.perf_counter()
        if now - self._last_line >= PLAIN_EVERY_S and self.done < self.total:
            self._last_line = now
            log.info("%s", f"{self.description}: {self.done}/{self.total}"
                     f"{_eta(now - self._start, self.done, self.total)} {self.info}".rstrip())

    def __exit__(self, exc_type, *_exc) -> None:
        global _last_stopped
        if self in _running:
            _running.remove(self)
        if exc_type is not None:
            if _last_stopped is None:  # the innermost loop the exception left
                _last_stopped = self.position()
        if self._progress is not None:
            self._progress.stop()
        elif exc_type is None:
            log.info("%s", f"{self.description}: {self.done}/{self.total} in "
                     f"{_duration(time.perf_counter() - self._start)} {self.info}".rstrip())


def fancy_enabled() -> bool:
    """A live bar only on a terminal, and not in a parallel sweep's workers (their bars would collide)."""
    if not sys.stderr.isatty():
        return False
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            target = str(HydraConfig.get().launcher.get("_target_", ""))
            return target == "" or target.endswith("BasicLauncher")
    except Exception:  # no Hydra (a library call): the terminal decides
        pass
    return True


@contextmanager
def progress(total: int, description: str) -> Iterator[_Bar]:
    """`with progress(n, "train") as bar: ... bar.advance(1, info=f"loss {l:.3g}")`"""
    with _Bar(total, description, fancy_enabled()) as bar:
        yield bar
