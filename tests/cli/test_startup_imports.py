"""The CLI's answers before a run (a mistyped key or experiment name, `--help`, `list`, `--cfg job`) import none of the
heavy packages: they come in half a second (docs/benchmarks.md), and pandas alone took as long again when
Hydra's plugin scan imported core/resume.py, which read the run folder's file names from results.py. The
command runs in a fresh interpreter (this one has imported them all), in process there, as typer's runner
calls it; that interpreter then names the heavy packages it holds."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers.cli import assert_one_line_error
from tests.helpers.repo import REPO_ROOT

HEAVY = ("pandas", "torch", "transformers", "matplotlib")

# argv[1]: the command line as JSON; prints the result and the heavy packages imported, as JSON
CODE = f"""
import json, sys
from tests.helpers.cli import cli_in_process
r = cli_in_process()(*json.loads(sys.argv[1]))
print(json.dumps({{"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                  "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def answer(*args: str) -> SimpleNamespace:
    """`icl-exp ARGS` in a fresh interpreter: its returncode, stdout and stderr (a subprocess's names, as
    assert_one_line_error reads them), and `heavy`, the heavy packages it imported."""
    proc = subprocess.run([sys.executable, "-c", CODE, json.dumps(args)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return SimpleNamespace(**json.loads(proc.stdout))


@pytest.mark.parametrize("args, says", [
    (("run", "linreg_icl", "trian.steps=1"), ("unknown config key 'trian.steps'", "did you mean train.steps?")),
    (("run", "linreg_icl", "train.steps=abc"), ("train.steps='abc' is ill-typed",)),
    (("run", "linreg_ic"), ("unknown experiment 'linreg_ic'", "did you mean linreg_icl?")),
])
def test_a_refused_command_line_imports_nothing_heavy(args, says):
    got = answer(*args)
    assert_one_line_error(got, *says)
    assert got.heavy == []


@pytest.mark.parametrize("args, says", [
    (("--help",), "Reproduce, figure by figure"),
    (("run", "--help"), "Presets (preset=NAME)"),
    (("list",), "linreg_icl"),
    (("run", "linreg_icl", "--cfg", "job"), "steps: 4000"),
    (("run", "patch_match", "dtype=bfloat16", "--cfg", "job"), "dtype: bfloat16"),
])
def test_help_and_list_import_nothing_heavy(args, says):
    got = answer(*args)
    assert got.returncode == 0 and says in got.stdout, got.stderr[-3000:]
    assert got.heavy == []


def test_the_check_sees_a_heavy_import():
    """The control: `plot` reads a run's CSVs with pandas and draws with matplotlib, and imports them even to
    refuse a folder that is not there."""
    got = answer("plot", str(REPO_ROOT / "no-such-run"))
    assert_one_line_error(got, "no such folder")
    assert {"pandas", "matplotlib"} <= set(got.heavy)
