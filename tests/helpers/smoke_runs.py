"""One `icl-exp run NAME preset=smoke` per experiment per test session, shared by every test that reads it.

The contract test (tests/core/test_run_folder_contract.py) checks every registered experiment's run
folder, and each experiment's own tests check its numbers; both read the same folder, so a smoke run
costs the suite once. A test that wants to change the folder copies it first.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.cli import run_cli

# The overrides an experiment's own tests need on the shared run (beside preset=smoke). `{root}` is the
# session's folder of smoke runs.
OVERRIDES: dict[str, tuple[str, ...]] = {
    # tests/dherin/test_linreg_icl.py and test_dw_convergence.py check that a chosen seed is recorded
    "linreg_icl": ("seed=3",),
    "dw_convergence": ("seed=3",),
    # tests/karbevski/test_gpt_wq.py stops a copy after 3 steps and resumes it: the lr schedule's horizon is
    # fixed so both follow this run's schedule; the data cache stays inside the session's folder
    "gpt_wq": ("train.decay_steps=6", "cache_dir={root}/gpt_wq_cache"),
    # tests/goldwaser/test_patch_match.py: one architecture other than the default, in bfloat16; GPT-2's
    # learned positions leave it no exact open loop, so the closed loop with its last-layer control
    "patch_match": ("model=tiny-gpt2", "dtype=bfloat16", "variant=closed_loop"),
}


class SmokeRuns:
    """`smoke_runs(name)` -> the run folder of `name` at preset=smoke, run on first use (a failed run is
    reported to every test that asks, not run again)."""

    def __init__(self, root: Path):
        self.root = root
        self._done: dict[str, subprocess.CompletedProcess] = {}

    def __call__(self, name: str) -> Path:
        run_dir = self.root / name
        if name not in self._done:
            extra = [o.format(root=self.root) for o in OVERRIDES.get(name, ())]
            self._done[name] = run_cli("run", name, "preset=smoke", *extra, f"hydra.run.dir={run_dir}")
        proc = self._done[name]
        assert proc.returncode == 0, f"icl-exp run {name} preset=smoke failed:\n{proc.stderr[-3000:]}"
        return run_dir
