"""A newcomer's first hour, through the real entry point: a typo gets a "did you mean", Hydra's usage
never shows for an argparse-style option, Ctrl-C at any moment is one line and exit 130, `plot` and
`report` word a missing folder alike, an experiment's folder points to its runs, a launcher without its
extra names the extra, and a sweep's end speaks in absolute paths with a claim tally."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers.cli import assert_one_line_error, ctrl_c_as_in_a_terminal, run_cli
from tests.helpers.repo import REPO_ROOT

# -- 2: did you mean ---------------------------------------------------------------------------------

def test_experiment_typo_suggests_the_name(icl, tmp_path):
    proc = icl("run", "linreg_ic", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "unknown experiment 'linreg_ic'", "did you mean linreg_icl?")
    assert not (tmp_path / "run").exists()


def test_far_off_experiment_name_suggests_nothing(icl_inprocess, tmp_path):
    proc = icl_inprocess("run", "zzzz", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "unknown experiment 'zzzz'")
    assert "did you mean" not in proc.stderr


@pytest.mark.parametrize("typo, meant", [("tiny-lama", "tiny-llama"), ("tiny-gema3", "tiny-gemma3")])
def test_offline_model_typo_is_not_tried_as_a_hub_id(icl, tmp_path, monkeypatch, typo, meant):
    # With the hub declared offline, a name tried as a hub id would end in "the hub is unreachable ...": its
    # absence shows the name was never tried, on any network and at any speed (no wall-clock bound).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    proc = icl("run", "patch_match", "preset=smoke", f"model={typo}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, f"model={typo}", f"did you mean model={meant}?")
    assert "hub is unreachable" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_folder_named_like_an_offline_model_is_taken_as_a_folder(tmp_path, monkeypatch):
    """A local folder `tiny-lama` is the user's model, not a typo: the model check (not ours) judges it."""
    from cli.overrides import validate
    from experiments.core.errors import UserError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-lama").mkdir()
    with pytest.raises(UserError) as err:
        validate("patch_match", ["preset=smoke", "model=tiny-lama"])
    assert "did you mean" not in str(err.value) and "config.json" in str(err.value)


@pytest.mark.parametrize("args, fragment", [
    (("--preset", "cpu"), "--preset cpu: overrides take no dashes: use preset=cpu"),
    (("--preset=cpu",), "use preset=cpu"),
    (("--seed", "3"), "use seed=3"),
    (("--train.steps", "3"), "use train.steps=3"),
    (("--frobnicate",), "unknown option --frobnicate"),
])
def test_dashed_option_names_the_override(icl, tmp_path, args, fragment):
    proc = icl("run", "linreg_icl", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, fragment)
    assert "usage:" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# -- 13: a launcher without its extra ----------------------------------------------------------------

@pytest.mark.parametrize("launcher, extra", [("parallel", "joblib"), ("slurm", "slurm")])
def test_launcher_without_its_extra_names_the_extra(icl_inprocess, tmp_path, monkeypatch, launcher, extra):
    from cli.check_extras import LAUNCHER_EXTRAS

    monkeypatch.setitem(sys.modules, LAUNCHER_EXTRAS[launcher][0], None)  # the plugin cannot be imported here
    proc = icl_inprocess("run", "linreg_icl", "-m", "preset=smoke", f"hydra/launcher={launcher}", "seed=0,1",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert_one_line_error(proc, f"hydra/launcher={launcher} needs the {extra} extra", f"pip install -e '.[{extra}]'")
    assert not (tmp_path / "sweep").exists()


def test_launcher_with_its_extra_passes():
    from cli.overrides import validate

    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="the joblib extra is not installed here")
    validate("linreg_icl", ["preset=smoke", "hydra/launcher=parallel", "seed=0,1"], multirun=True)


# -- 4: Ctrl-C during start-up -----------------------------------------------------------------------

# The CLI, with torch's first import made to wait for a signal: Ctrl-C then lands while the command line is
# being checked (validation imports the experiment, and torch with it), on any machine, at any load.
PAUSE_AT_TORCH = """
import importlib.abc, runpy, sys, time
class PauseAtTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("importing torch", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
sys.meta_path.insert(0, PauseAtTorch())
sys.argv = ["icl-exp", *sys.argv[1:]]
runpy.run_module("cli.main", run_name="__main__")
"""


def test_ctrl_c_during_start_up_is_one_line_and_130(tmp_path):
    """SIGINT while the CLI imports torch (validation, before Hydra starts the job): one line, exit 130, no
    traceback, no empty parentheses, and no run folder."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", PAUSE_AT_TORCH, "run", "linreg_icl", "preset=smoke",
                             f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HYDRA_FULL_ERROR": "0"},
                            preexec_fn=ctrl_c_as_in_a_terminal)
    first = proc.stderr.readline()  # the signal goes only once the import is waiting for it
    assert first == "importing torch\n", first + proc.communicate(timeout=120)[1][-3000:]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "()" not in err, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), err
    assert "nothing was written" in err and not run_dir.exists(), err


# -- 3: plot and report on a missing folder, plot on an experiment's folder --------------------------

def test_plot_and_report_word_a_missing_folder_alike(icl, tmp_path):
    missing = tmp_path / "nope"
    lines = []
    for command in ("plot", "report"):
        proc = icl(command, str(missing))
        assert proc.returncode == 2, proc.stderr
        assert_one_line_error(proc, f"{missing}: no such folder (")
        lines.append(proc.stderr.strip().split(" (")[0])
    assert lines[0] == lines[1]


def _fake_run(folder, start: str, status: str = "complete"):
    import json

    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"experiment": "linreg_icl", "status": status, "start": start}))
    (folder / "metrics.csv").write_text("experiment,run_id,metric,value\n")
    return folder


def test_plot_on_an_experiments_folder_points_to_its_newest_run(icl, tmp_path):
    exp_dir = tmp_path / "results" / "linreg_icl"
    _fake_run(exp_dir / "2026-01-01_00-00-00-aaaaaa", "2026-01-01T00:00:00+00:00")
    newest = _fake_run(exp_dir / "2026-01-02_00-00-00-bbbbbb", "2026-01-02T00:00:00+00:00")
    _fake_run(exp_dir / "2026-01-03_00-00-00-cccccc", "2026-01-03T00:00:00+00:00", status="failed")
    (exp_dir / "multirun" / "2026-01-04_00-00-00-dddddd").mkdir(parents=True)
    proc = icl("plot", str(exp_dir))
    assert_one_line_error(proc, f"{exp_dir} is a folder of runs (3 runs, 1 sweep under", "not one run",
                          f"newest complete run: icl-exp plot {newest}")
    assert "sweep with no" not in proc.stderr and not (exp_dir / "claims.csv").exists()


# -- 7: patch export ---------------------------------------------------------------------------------

def test_patch_export_output_help_and_snippet(icl, tmp_path):
    import json

    out = tmp_path / "snow"
    proc = icl("patch", "export", "model=tiny-llama", "prompt=Write a haiku about snow.", f"out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout + proc.stderr
    assert "patch_export: checkpoint ->" in text and "((" not in text
    assert "Writing model shards" not in text and "Loading weights" not in text and "it/s" not in text
    assert f"out={out}" in json.loads((out / "run.json").read_text())["overrides"]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("use it:"))
    snippet = [line.strip() for line in lines[start + 1:start + 4]]
    assert len(snippet) == 3 and str(out / "patched") in snippet[1]
    # the snippet, run as printed, gives the token the original model predicts after the whole prompt
    code = "\n".join([*snippet, "print(int(logits.argmax()))"])
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert int(ran.stdout.split()[-1]) == json.loads((out / "inputs.json").read_text())["reference_top1"]


def test_patch_export_help_lists_its_keys(icl_inprocess):
    proc = icl_inprocess("patch", "export", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for key in ("model=", "prompt=", "out=", "variant=", "dtype=", "chat_template="):
        assert key in text, text


# -- 9: a sweep's end --------------------------------------------------------------------------------

def test_sweep_end_absolute_paths_and_claim_tally(icl, tmp_path, monkeypatch):
    """Run from another folder with a relative sweep folder: every path the sweep's end prints is absolute,
    no Hydra-logger line shows, and the tally adds up the jobs' own claims.csv."""
    import pandas as pd

    proc = run_cli("run", "markov_collapse", "-m", "preset=smoke", "seed=0,1", "hydra.sweep.dir=sweep", cwd=tmp_path,
                   env={"PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "sweep"
    out = proc.stdout
    after_jobs = out[out.rindex("done in "):]  # the last job's last line, then the sweep's end
    assert "[HYDRA]" not in after_jobs and "STIXNonUnicode" not in out + proc.stderr, out[-3000:]
    assert " results/" not in after_jobs and " sweep/" not in after_jobs, after_jobs
    end = proc.stdout.splitlines()[-3:]
    assert end[0] == (f"combined figures (markov_collapse.png, claims_over_seeds.png) and claims of the complete "
                      f"jobs: {sweep}")  # a sweep over seeds alone: each claim over the seeds too
    assert end[1] == f"all 2 jobs complete: {sweep}"
    claims = [pd.read_csv(sweep / job / "claims.csv") for job in ("0", "1")]
    passed = sum(int(c["passed"].sum()) for c in claims)
    failed = sum(len(c) for c in claims) - passed
    assert end[2].startswith(f"claims: {passed} passed, {failed} failed over the 2 complete jobs")
    assert end[2].endswith(f": {sweep / 'claims.csv'}")
    for job, c in zip(("0", "1"), claims, strict=True):
        n_failed = len(c) - int(c["passed"].sum())
        assert (f"{n_failed} in job {job} (seed={job})" in end[2]) == (n_failed > 0), end[2]


# -- 8: run --help -----------------------------------------------------------------------------------

def test_run_help_lists_experiments_presets_and_cfg_job(icl_inprocess):
    from experiments.core.registry import experiment_names

    proc = icl_inprocess("run", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "{name}" not in proc.stdout.lower() and "run [OPTIONS] NAME [KEY=VALUE]..." in text
    assert all(name in text for name in experiment_names())
    assert all(f"{preset}:" in text for preset in ("paper", "cpu", "smoke"))
    assert "--cfg job" in text


# -- 10: plot on an interrupted linreg_icl run -------------------------------------------------------

def test_plot_of_an_interrupted_linreg_run(tmp_path, monkeypatch, recwarn):
    """One validation checkpoint and a few training steps: no empty panel, no offset tick label, no
    matplotlib warning, and the figure says it is incomplete."""
    import json

    import pandas as pd

    import experiments.dherin.linreg_icl.run as linreg
    from experiments.core.figures import render

    run = tmp_path / "run"
    run.mkdir()
    rows = [dict(metric="train_loss", value=1.2 - 0.01 * s, step=s) for s in range(1, 37)]
    rows += [dict(metric=m, value=v, step=0) for m, v in (("val_loss_context", 0.98599404), (
        "val_loss_patched", 0.98599404 + 1e-14), ("val_loss_no_context", 0.94), ("val_max_abs_diff", 1.2e-7),
        ("val_loss_zero_predictor", 0.94))]
    frame = pd.DataFrame(rows).assign(experiment="linreg_icl", run_id="r", seed=0, dtype="float32", mlp_skip=False)
    frame.to_csv(run / "metrics.csv", index=False)
    (run / "run.json").write_text(json.dumps({"experiment": "linreg_icl", "status": "interrupted", "preset": "paper",
                                              "stopped_at": "train 36/4000", "error": "KeyboardInterrupt"}))
    figures = []
    original = linreg.save_figure
    monkeypatch.setattr(linreg, "save_figure", lambda fig, d, n: figures.append(fig) or original(fig, d, n))
    assert render(run)
    (fig,) = figures
    assert len(fig.axes) == 2  # the loss panels; the grid's heat maps are left out, not left empty
    assert "INCOMPLETE" in fig._suptitle.get_text() and "interrupted at train 36/4000" in fig._suptitle.get_text()
    assert all(not ax.yaxis.get_offset_text().get_text() for ax in fig.axes)
    assert not [w for w in recwarn if "matplotlib" in str(w.filename) or "xlim" in str(w.message)]
