"""Ctrl-C and SIGTERM in every phase of a run: run.json says `interrupted` and where it stopped, the
console says it in one line. Each test interrupts at a place the run announces (ICL_EXP_PAUSE_AT: the
run waits there for the signal), never after a sleep, so it holds on a fast machine and a loaded one."""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest

from experiments.core import progress
from tests.helpers.cli import ctrl_c_as_in_a_terminal, start_cli
from tests.helpers.in_process import compose

# linreg_icl at preset=smoke, as small as the phases allow: two training steps, one grid task
OVERRIDES = ("train.steps=2", "eval.grid_tasks=1")

# Where to pause (ICL_EXP_PAUSE_AT) -> what run.json's stopped_at then says: every phase of the runner,
# the training loop, the evaluation after it, and between the experiment's claims.
PLACES = {
    "setup": "setup",
    "experiment": "experiment",
    "train 0": "train 0/2",
    "train 1": "train 1/2",
    "experiment (after train 2/2)": "experiment (after train 2/2)",
    "grid 0": "grid 0/1",
    "experiment (after claim dherin.fig2.patch_equals_context)":
        "experiment (after claim dherin.fig2.patch_equals_context)",
    "results": "results",
    "figures": "figures",
    "summary": "summary",
}


@pytest.fixture(scope="module")
def smoke_config():
    return compose("linreg_icl", *OVERRIDES)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", list(PLACES))
def test_an_interrupt_in_each_phase_says_where_it_stopped(tmp_path, monkeypatch, smoke_config, where, sig):
    """In this process: the run pauses at `where` and the signal is raised there, with the handler that
    is in place at that moment (a phase without the runner's SIGTERM handler fails here, not by dying)."""
    from experiments.core.runner import run

    def signal_here():
        handler = signal.getsignal(sig)
        assert handler not in (signal.SIG_DFL, signal.SIG_IGN), f"no {sig.name} handler at {where}"
        signal.raise_signal(sig)  # the handler runs before this returns
        raise AssertionError(f"{sig.name} at {where} did not stop the run")

    monkeypatch.setenv(progress.PAUSE_ENV, where)
    monkeypatch.setattr(progress, "_wait_for_signal", signal_here)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run("linreg_icl", smoke_config, tmp_path, "interrupted", list(OVERRIDES), preset="smoke")
    finally:
        signal.signal(signal.SIGINT, previous_int)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "interrupted" and record["end"] is not None
    assert record["stopped_at"] == PLACES[where]
    assert record["error"] == ("Terminated: SIGTERM" if sig == signal.SIGTERM else "KeyboardInterrupt")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the runner gave SIGTERM back


def _interrupt_cli(run_dir, where: str, sig: signal.Signals) -> tuple[subprocess.CompletedProcess, str]:
    """`icl-exp run linreg_icl preset=smoke ...` paused at `where`: the signal is sent once the run says
    it is there. Returns the process (its stderr without the pause line) and the pause line."""
    proc = start_cli("run", "linreg_icl", "preset=smoke", *OVERRIDES, "device=cpu", f"hydra.run.dir={run_dir}",
                     env={progress.PAUSE_ENV: where}, stdout=subprocess.DEVNULL, preexec_fn=ctrl_c_as_in_a_terminal)
    guard = threading.Timer(600, proc.kill)  # only against a hang: the test itself waits on the pause line
    guard.start()
    try:
        before = []
        for line in proc.stderr:
            if line.startswith("paused at "):
                break
            before.append(line)
        else:
            proc.wait()
            raise AssertionError(f"the run ended without pausing at {where}:\n{''.join(before)[-3000:]}")
        proc.send_signal(sig)
        rest = proc.stderr.read()
        proc.wait()
    finally:
        guard.cancel()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", "".join(before) + rest), line


@pytest.mark.parametrize(("sig", "where", "stopped_at"), [(signal.SIGINT, "train 1", "train 1/2"),
                                                          (signal.SIGTERM, "figures", "figures")],
                         ids=["SIGINT-in-training", "SIGTERM-in-figures"])
def test_ctrl_c_is_one_line_and_interrupted(tmp_path, sig, where, stopped_at):
    """Through the CLI: exit 130, one line on stderr that says where, run.json interrupted there."""
    run_dir = tmp_path / "run"
    proc, paused = _interrupt_cli(run_dir, where, sig)
    assert paused.startswith(f"paused at {stopped_at} ")
    err = proc.stderr
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"interrupted at {stopped_at} "), err
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "interrupted" and record["end"] is not None
    assert record["stopped_at"] == stopped_at


def test_where_it_stopped_is_the_loop_the_exception_left_else_the_phase():
    progress.reset()
    progress.phase("experiment")
    with pytest.raises(RuntimeError):  # a loop's error that the experiment catches and survives
        with progress.progress(5, "probe") as bar:
            bar.advance(2)
            raise RuntimeError
    with progress.progress(3, "train") as bar:
        bar.advance(3)
    try:
        raise KeyboardInterrupt  # later, outside any loop: not "at probe 2/5"
    except KeyboardInterrupt:
        assert progress.last_progress() == "experiment (after train 3/3)"
    try:  # a loop that re-raises Ctrl-C with its own message (gpt_wq): still where the loop stood
        with progress.progress(10, "gpt_wq") as bar:
            bar.advance(4)
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise KeyboardInterrupt("interrupted at step 4 of 10") from None
    except KeyboardInterrupt as err:
        assert progress.last_progress(err) == "gpt_wq 4/10"
    progress.reset()
