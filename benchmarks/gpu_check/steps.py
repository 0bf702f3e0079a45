"""One step of the check: a command with a timeout, under the whole check's deadline, its output in a log
and its outcome in a small JSON file, whatever happens (a timeout kills its whole process group: torchrun's
ranks and joblib's workers too). Lanes of steps run side by side, the steps of a lane one after another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIN_LEFT_S = 8  # a step that would get less than this is skipped, not started
_ALIVE: set[subprocess.Popen] = set()  # the steps running now (stop_all ends them on Ctrl-C)
_LOCK = threading.Lock()


@dataclass
class Step:
    name: str
    what: str  # what it checks, one line for the summary
    argv: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    runs: str | None = None  # the folder its run folders go to (read by the summary)
    cpu_argv: list[str] | None = None  # the same check on the CPU, run again there if this one fails
    reproduce: bool = False  # an `icl-exp reproduce`: its failed experiments are what goes to the CPU


@dataclass
class Result:
    name: str
    what: str
    status: str  # passed, failed, timed_out, skipped
    rc: int | None
    seconds: float
    command: str
    log: str
    phase: str = ""


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def capped(self, seconds: float) -> Deadline:
        """A deadline at most `seconds` from now and never past this one."""
        d = Deadline(0)
        d.end = min(self.end, time.monotonic() + seconds)
        return d


def run_step(step: Step, deadline: Deadline, out: Path, env: dict[str, str], phase: str) -> Result:
    """Run `step` for at most min(its timeout, the time left); write out/steps/NAME.json; never raises for
    what the command does."""
    log = out / "logs" / f"{step.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(step.argv)
    left = deadline.left()
    if left < MIN_LEFT_S:
        result = Result(step.name, step.what, "skipped", None, 0.0, command, str(log.relative_to(out)), phase)
        log.write_text(f"skipped: {left:.0f} s left of the check's time\n")
        return _record(result, out)
    limit = min(step.timeout_s, left)
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {command}\n")
        f.flush()
        try:
            proc = subprocess.Popen(step.argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**env, **step.env}, start_new_session=True)
        except OSError as err:
            f.write(f"could not start: {err}\n")
            return _record(Result(step.name, step.what, "failed", None, 0.0, command,
                                  str(log.relative_to(out)), phase), out)
        with _LOCK:
            _ALIVE.add(proc)
        try:
            rc = proc.wait(timeout=limit)
            status = "passed" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc, status = None, "timed_out"
            f.write(f"\ntimed out after {limit:.0f} s\n")
        finally:
            with _LOCK:
                _ALIVE.discard(proc)
    seconds = round(time.monotonic() - t0, 1)
    return _record(Result(step.name, step.what, status, rc, seconds, command, str(log.relative_to(out)), phase), out)


def stop_all() -> None:
    """End every step still running (their process groups: started in sessions of their own, they do not
    get the terminal's Ctrl-C)."""
    with _LOCK:
        running = list(_ALIVE)
    for proc in running:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the step's process group (the runs mark themselves interrupted), SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _record(result: Result, out: Path) -> Result:
    path = out / "steps" / f"{result.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=1) + "\n")
    print(f"[{result.phase}] {result.name}: {result.status} ({result.seconds:.0f} s)", flush=True)
    return result


def run_lanes(lanes: list[list[Step]], deadline: Deadline, out: Path, env: dict[str, str],
              phase: str) -> list[Result]:
    """Each lane in a thread of its own, its steps in order; the results in the lanes' order."""
    results: list[list[Result]] = [[] for _ in lanes]

    def lane(i: int) -> None:
        for step in lanes[i]:
            results[i].append(run_step(step, deadline, out, env, phase))

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(len(lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for rs in results for r in rs]
