"""Bad input found in the first hour of use: each gets one line, a non-zero exit, no traceback and
no run folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.cli import assert_one_line_error


@pytest.mark.parametrize("folder", ["/proc/icl_exp_x", "/sys/icl_exp_x"])
def test_output_folder_that_cannot_be_made(icl_inprocess, folder):
    """os.access says yes for root on /proc and /sys: the check must actually try to make the folder."""
    if not Path(folder).parent.is_dir():
        pytest.skip(f"no {Path(folder).parent} here")
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", f"hydra.run.dir={folder}")
    assert_one_line_error(proc, "cannot write the output folder", folder)
    assert not Path(folder).exists()


def test_output_folder_probe_leaves_no_run_folder(tmp_path):
    """A writable folder passes the check, which leaves no run folder behind."""
    from cli.launch import check_writable

    target = tmp_path / "a" / "b" / "run"
    check_writable(target)
    assert not target.exists()


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("threads=abc",), ("threads='abc'", "an integer")),
        (("threads=0",), ("threads=0", "at least 1")),
        (("seed=0,1",), ("seed=0,1", "use -m to sweep")),
        (("preset=tpu",), ("preset=tpu is not a preset: choose one of", "paper", "cpu", "smoke")),
        (("+trian.steps=10",), ("trian.steps", "train.steps")),
        (("+foo=1",), ("foo", "no experiment reads", "train.steps")),
        (("++foo=1",), ("foo", "no experiment reads")),
        (("trian.steps=10",), ("unknown config key 'trian.steps'", "train.steps")),
    ],
)
def test_first_hour_bad_input(icl_inprocess, tmp_path, args, fragments):
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", *args, f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, *fragments)
    assert "+trian" not in proc.stderr.replace("+trian.steps=10", "") and "use +" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_an_experiment_without_a_schema_is_one_line(icl_inprocess, monkeypatch):
    """A name the registry lists with no home holding its config class: a developer's error, one line, also when
    the ConfigStore holds no config yet (a command line stores its own experiment's alone)."""
    from hydra.core.config_store import ConfigStore

    from experiments.core import registry

    monkeypatch.setattr(registry, "experiment_names", lambda: ["no_schema_yet"])
    monkeypatch.setattr(ConfigStore.instance(), "repo", {})
    proc = icl_inprocess("run", "no_schema_yet")
    assert_one_line_error(proc, "experiment no_schema_yet has no config", "class NoSchemaYetConfig(Common):",
                          "experiments/<paper>/no_schema_yet/__init__.py")


def test_cfg_with_a_sweep_is_one_line(icl_inprocess, tmp_path):
    """`--cfg job` prints one job's config; with -m Hydra raised a ValueError traceback."""
    proc = icl_inprocess("run", "linreg_icl", "-m", "seed=0,1", "--cfg", "job", f"hydra.sweep.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "--cfg shows one job's config", "drop -m", "icl-exp run linreg_icl KEY=VALUE --cfg job")
    assert not (tmp_path / "run").exists()


def test_device_cuda_without_cuda_fails_before_the_run_folder(icl_inprocess, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", "device=cuda", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "CUDA is not available")
    assert not (tmp_path / "run").exists()


def test_legitimate_overrides_still_pass():
    """`+key` for a key the composed config has is Hydra's error; `++key` on an existing key is an
    override; group selections and the sweep/launcher flags keep working."""
    from cli.overrides import validate

    cfg = validate("linreg_icl", ["preset=smoke", "++train.steps=3", "hydra/launcher=parallel"])
    assert cfg.train.steps == 3
    validate("linreg_icl", ["preset=smoke", "seed=0,1"], multirun=True)


def test_seed_sweep_real_entry_point(icl, tmp_path):
    """Through the real entry point too: Hydra's five-line ambiguity message never shows."""
    proc = icl("run", "linreg_icl", "preset=smoke", "seed=0,1", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "use -m to sweep")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_no_write_access_is_named(icl_inprocess, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    proc = icl_inprocess("run", "linreg_icl", "preset=smoke", f"hydra.run.dir={ro / 'run'}")
    assert_one_line_error(proc, "cannot write the output folder")
