"""Progress for long loops: a rich bar with ETA on a terminal, one line per loop; plain and quiet
otherwise (pipes, CI, cluster logs, parallel sweep workers): a line with the ETA at most once a
minute while the loop runs, and one line when it ends, so a SLURM .out file stays readable.

Where a run stands, for run.json's `stopped_at`: the innermost loop running ("train 1200/4000"), else
the runner's phase ("figures"; "experiment (after grid 100/100)" between an experiment's loops).

ICL_EXP_PAUSE_AT=WHERE (tests): the run stops at WHERE, a phase ("figures") or a loop's step
("train 2" = "train 2/N"; "train 0" is the loop's start), says `paused at WHERE` in one line on stderr
and waits there for a signal (Ctrl-C, SIGTERM), so a test interrupts a chosen phase whatever the
machine's speed. Unset, nothing pauses.
"""

from __future__ import annotations

import logging
import os
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
PAUSE_ENV = "ICL_EXP_PAUSE_AT"

# The loops running now, innermost last, and the run's phase, so an interrupted or failed run can
# record in run.json how far it got ("train 1200/4000", "figures").
_running: list[_Bar] = []
_phase: _Phase | None = None
_last_stopped: tuple[str, BaseException] | None = None  # the innermost loop an exception left, and the exception


def last_progress(err: BaseException | None = None) -> str | None:
    """Where the run stands: the innermost loop running now; else the innermost loop that `err` (default:
    the exception being handled, else the last one) or the exception it replaced left; else the phase."""
    if _running:
        return _running[-1].position()
    err = err if err is not None else sys.exc_info()[1]
    if _last_stopped is not None and (err is None or _caused(err, _last_stopped[1])):
        return _last_stopped[0]
    return _phase.position() if _phase is not None else None


def _caused(err: BaseException | None, origin: BaseException) -> bool:
    """Is `origin` `err`, or what `err` was raised from or while handling (a loop that re-raises
    KeyboardInterrupt with its own message)?"""
    seen = set()
    while err is not None and id(err) not in seen:
        if err is origin:
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def reset() -> None:
    """Forget finished loops and the phase (a new run starts; a sweep runs several in one process)."""
    global _last_stopped, _phase
    _running.clear()
    _last_stopped = None
    _phase = None


def phase(name: str) -> None:
    """The run's phase from now on ("setup", "experiment", "figures", ...): an interrupt or error outside
    any loop stops "at figures"."""
    global _phase, _last_stopped
    _phase = _Phase(name)
    _last_stopped = None  # (and its traceback's frames: an exception caught before is history now)
    _pause_if_asked(name)


def note_done(what: str) -> None:
    """A step of the phase finished (a loop ended, a claim was checked): an interrupt before the next
    loop reads "experiment (after WHAT)"."""
    if _phase is not None:
        _phase.after = what
        _pause_if_asked(_phase.position())


def _pause_if_asked(position: str) -> None:
    """ICL_EXP_PAUSE_AT (module docstring): at the named place, one line on stderr, then wait for a
    signal; its handler's exception (KeyboardInterrupt, the runner's Terminated) ends the wait."""
    where = os.environ.get(PAUSE_ENV)
    if not where or not (position == where or position.startswith(where + "/")):
        return
    print(f"paused at {position} ({PAUSE_ENV}): waiting for a signal", file=sys.stderr, flush=True)
    _wait_for_signal()


def _wait_for_signal() -> None:
    while True:
        time.sleep(3600)


class _Phase:
    def __init__(self, name: str):
        self.name = name
        self.after: str | None = None

    def position(self) -> str:
        return f"{self.name} (after {self.after})" if self.after else self.name


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
        global _last_stopped
        _last_stopped = None  # a new loop: an exception caught before is history (and its frames are freed)
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
        else:
            self._plain_line()
        _pause_if_asked(self.position())

    def _plain_line(self) -> None:
        now = time.perf_counter()
        if now - self._last_line >= PLAIN_EVERY_S and self.done < self.total:
            self._last_line = now
            log.info("%s", f"{self.description}: {self.done}/{self.total}"
                     f"{_eta(now - self._start, self.done, self.total)} {self.info}".rstrip())

    def __exit__(self, exc_type, exc, _tb) -> None:
        global _last_stopped
        if self in _running:
            _running.remove(self)
        if exc is not None and (_last_stopped is None or not _caused(exc, _last_stopped[1])):
            _last_stopped = (self.position(), exc)  # the innermost loop the exception left
        if self._progress is not None:
            self._progress.stop()
        elif exc_type is None:
            log.info("%s", f"{self.description}: {self.done}/{self.total} in "
                     f"{_duration(time.perf_counter() - self._start)} {self.info}".rstrip())
        if exc is None:
            note_done(self.position())


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
        _pause_if_asked(bar.position())  # inside the `with`: an interrupt here leaves the loop at 0/N
        yield bar
