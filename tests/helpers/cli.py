"""The real `icl-exp` entry point, as a user runs it: in a fresh interpreter (Hydra keeps global state; a
subprocess is a clean slate), or in this process through typer's runner for the errors raised before
Hydra starts a run; and what a refusal must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.repo import REPO_ROOT

OFFLINE = {"HF_HUB_OFFLINE": "1"}  # env for a run that must not reach the hub


def with_cpu_device(args: Sequence[str]) -> list[str]:
    """`icl-exp run NAME ...` gets device=cpu unless it names a device (the suite runs on CPU: conftest.py)."""
    args = list(args)
    if args[:1] == ["run"] and not any(a.startswith(("device=", "+device=", "++device=")) for a in args):
        args.append("device=cpu")
    return args


def cli_command(*args: str, launcher: Sequence[str] = (), cpu: bool = True) -> list[str]:
    """The argv of `icl-exp ARGS` in this interpreter; `launcher` goes between the interpreter and the module,
    e.g. ("-m", "torch.distributed.run", "--nproc_per_node=2") for torchrun. cpu=False leaves a `run` without
    a device its default (auto: for a GPU faked in the child, or a launcher that decides from the device)."""
    return [sys.executable, *launcher, "-m", "cli.main", *(with_cpu_device(args) if cpu else args)]


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, unbuffered output, Hydra's one-line errors, then `env` on top."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", **(env or {})}


def run_cli(*args: str, cwd: Path = REPO_ROOT, timeout: float = 600, env: dict[str, str] | None = None,
            launcher: Sequence[str] = (), cpu: bool = True) -> subprocess.CompletedProcess:
    """`icl-exp ARGS...` in a fresh interpreter, to its end; output captured as text. `env` goes on top of
    cli_env's; `launcher` and `cpu` as in cli_command."""
    return subprocess.run(cli_command(*args, launcher=launcher, cpu=cpu), cwd=cwd, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(*args: str, cwd: Path = REPO_ROOT, env: dict[str, str] | None = None, cpu: bool = True,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen) -> subprocess.Popen:
    """`icl-exp ARGS...` started in a fresh interpreter and left running (text pipes); `popen` goes to Popen."""
    return subprocess.Popen(cli_command(*args, cpu=cpu), cwd=cwd, env=cli_env(env), stdout=stdout, stderr=stderr,
                            text=True, **popen)


def ctrl_c_as_in_a_terminal() -> None:
    """`preexec_fn` for a child that a test sends SIGINT: SIGINT back to its default action, so that Python
    installs its KeyboardInterrupt handler there. A shell starts a background job (`bash .ci/run &`,
    `nohup`) with SIGINT ignored, every process below inherits that, and Python leaves an ignored SIGINT
    ignored: the child would sleep through the test's Ctrl-C, and the test hang until its guard."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class InProcessResult:
    """A typer runner's result under a subprocess's names (returncode, stdout, stderr)."""

    def __init__(self, r):
        self.returncode, self.stdout, self.stderr = r.exit_code, r.stdout, r.stderr


@contextmanager
def logging_kept():
    """Python's logging as it was before, after a job ran in this process: Hydra configures logging for a job
    (conf/config.yaml's job_logging: handlers on typer's captured streams, which the runner closes), and the
    next test would log into a closed file. A user's command ends with its process; a test's does not."""
    import logging

    loggers = [logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers]
    try:
        yield
    finally:
        for lg, level, handlers, propagate, disabled in saved:
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled


def invoke_in_process(*args: str):
    """typer's runner on the CLI with ARGS, logging kept as it was (`logging_kept`): the runner's result."""
    from typer.testing import CliRunner

    from cli.main import app

    with logging_kept():
        return CliRunner().invoke(app, list(args))


def cli_in_process():
    """`icl-exp ARGS` in this process, as a function of ARGS: fast, for the errors said before a run begins
    (the command line's, and a plain run's checks in its job)."""
    return lambda *args: InProcessResult(invoke_in_process(*args))


def assert_one_line_error(proc, *fragments):
    """A refusal: non-zero exit, no traceback, stderr one `error:` line (rich may wrap it) with each fragment."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    text = " ".join(proc.stderr.split())  # rich may wrap a long line
    assert text.startswith("error:"), proc.stderr
    for fragment in fragments:
        assert fragment in text, proc.stderr
