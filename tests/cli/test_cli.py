"""Every CLI command, including each bad input: one clear line, non-zero exit, no traceback, and
no run folder left behind."""

import json
from pathlib import Path

import pandas as pd
import pytest

from cli.main import unique_stamp
from experiments.core import registry, runner
from experiments.core.errors import UserError
from experiments.core.figures import render
from experiments.core.registry import Experiment
from tests.helpers.cli import assert_one_line_error, start_cli
from tests.helpers.repo import REPO_ROOT


def test_list_shows_every_experiment(icl):
    proc = icl("list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()  # piped, not a terminal: still one line per experiment
    names = [line.split()[0] for line in lines]
    assert sorted(names) == registry.experiment_names()
    papers = [registry.PAPER_PACKAGES.index(registry.paper_package(n)) for n in names]
    assert papers == sorted(papers)  # grouped by paper
    linreg = next(line for line in lines if line.startswith("linreg_icl "))
    assert "Dherin et al." in linreg and "Fig. 2" in linreg and "rank-1" in linreg


def test_unknown_experiment_lists_known_ones(icl_inprocess, tmp_path):
    proc = icl_inprocess("run", "no_such_thing", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "unknown experiment 'no_such_thing'", "linreg_icl")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.stepz=5", "unknown config key 'train.stepz'"),
        ("nonsense=1", "unknown config key 'nonsense'"),
        ("seed=abc", "seed='abc' is ill-typed: expected an integer"),
        ("train.steps=1.5", "train.steps=1.5 is ill-typed"),
        ("train.lr=fast", "train.lr='fast' is ill-typed: expected a number"),
        ("model.mlp_skip=maybe", "model.mlp_skip='maybe' is ill-typed: expected true or false"),
        ("dtype=float8", "dtype='float8' is not one of"),
        ("device=tpu", "device='tpu' is not one of"),
        ("preset=huge", "preset"),
        ("eval.grid_size=7", "eval.grid_size=7 must be even"),
    ],
)
def test_bad_override_is_named(icl_inprocess, tmp_path, override, fragment):
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", override, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, fragment)
    assert not (tmp_path / "run").exists()


def test_bad_value_inside_a_sweep_is_caught_before_any_job(icl_inprocess, tmp_path):
    proc = icl_inprocess("run", "linreg_icl", "-m", "preset=smoke", "seed=0,x", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert_one_line_error(proc, "seed='x' is ill-typed")
    assert not (tmp_path / "sweep").exists()


def test_unwritable_output_folder(icl_inprocess, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", f"hydra.run.dir={blocker / 'run'}")
    assert_one_line_error(proc, "cannot write the output folder", "is not a folder")


def test_plot_on_a_folder_that_is_not_a_run(icl, icl_inprocess, tmp_path):
    proc = icl("plot", str(tmp_path))  # once through the real entry point
    assert_one_line_error(proc, "is not a run folder")
    proc = icl_inprocess("plot", str(tmp_path / "missing"))
    assert_one_line_error(proc, "no such folder")


def test_two_stamps_in_the_same_second_differ():
    stamps = {unique_stamp() for _ in range(200)}
    assert len(stamps) == 200


def test_two_runs_started_together_get_two_folders(icl, tmp_path):
    procs = [start_cli("run", "linreg_icl", "preset=smoke", "train.steps=2", "eval.grid_tasks=1", cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO_ROOT)}) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    runs = list((tmp_path / "results" / "linreg_icl").iterdir())
    assert len(runs) == 2
    assert all(json.loads((r / "run.json").read_text())["status"] == "complete" for r in runs)


def _failing_experiment(exc: BaseException) -> Experiment:
    def run(cfg, ctx):
        ctx.log("partial", 1.0, step=0)
        raise exc

    return Experiment("nobody", "none", "fails on purpose", run=run, plot=lambda m, d: [], name="boom")


@pytest.mark.parametrize("exc, status", [(RuntimeError("kaboom"), "failed"), (KeyboardInterrupt(), "interrupted")])
def test_a_run_that_dies_is_marked_failed_and_keeps_its_metrics(tmp_path, monkeypatch, exc, status):
    """A crash is `failed`; Ctrl-C is `interrupted` (not failed with KeyboardInterrupt)."""
    from omegaconf import OmegaConf

    monkeypatch.setattr(registry, "get", lambda name: _failing_experiment(exc))
    cfg = OmegaConf.create({"seed": 0, "device": "cpu", "dtype": "float32"})
    with pytest.raises(type(exc)):
        runner.run("boom", cfg, tmp_path, "r1", [])
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == status
    assert record["end"] is not None and type(exc).__name__ in record["error"]
    assert pd.read_csv(tmp_path / "metrics.csv")["metric"].tolist() == ["partial"]
    assert not (tmp_path / "claims.csv").exists()
    assert not list(tmp_path.glob(".*.tmp"))  # no half-written temp files


def test_render_refuses_an_empty_folder(tmp_path):
    with pytest.raises(UserError):
        render(Path(tmp_path))


def test_launcher_configscompose_config():
    """`hydra/launcher=parallel` (joblib) composes; `slurm` needs the optional extra."""
    from cli.overrides import validate

    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="hydra-joblib-launcher (the joblib extra)")
    cfg = validate("linreg_icl", ["preset=smoke", "hydra/launcher=parallel"])
    # the project's joblib launcher (one job per GPU for CUDA jobs); n_jobs null: from the jobs
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("icl_exp_parallel.ParallelLauncher") and launcher.n_jobs is None
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        pytest.skip("hydra-submitit-launcher (the slurm extra) is not installed")
    cfg = validate("linreg_icl", ["preset=smoke", "hydra/launcher=slurm"])
    assert "SlurmLauncher" in cfg.hydra.launcher._target_
    assert cfg.hydra.launcher.gpus_per_node is None  # follows the experiment (experiments/core/slurm_launcher.py)


def test_hydra_flags_pass_through(icl, tmp_path):
    """`--cfg job` reaches Hydra's own parser wherever it stands, and runs nothing."""
    proc = icl("run", "linreg_icl", "--cfg", "job", "preset=smoke", "train.steps=7")
    assert proc.returncode == 0, proc.stderr
    assert "steps: 7" in proc.stdout and "n_examples: 20" in proc.stdout


def test_free_form_key_is_checked_by_the_experiment(icl_inprocess, tmp_path):
    """gemma_match's `prompts` takes a list or a file: the generic type check steps aside, its own
    validate() still names a missing file."""
    proc = icl_inprocess("run", "gemma_match", "preset=smoke", f"prompts={tmp_path / 'none.txt'}",
                         f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "none.txt", "no such file")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", registry.experiment_names())
def test_every_experiment_is_typed(name):
    """Each experiment's config composes onto its config class (experiments/<paper>/<name>/__init__.py), so no key can
    take an ill-typed value silently; the CLI keeps no type check of its own."""
    from omegaconf import OmegaConf

    from cli.compose import compose_config

    cfg = compose_config([f"experiment={name}", "preset=smoke"])
    assert OmegaConf.get_type(cfg) not in (None, dict), f"{name} has no schema"
