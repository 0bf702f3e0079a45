"""Every experiment's composed config at every preset, as `icl-exp run NAME preset=P --cfg job` prints it,
against the copy kept in tests/core/cfg_snapshots/NAME.yaml (one file per experiment, a section per preset,
each headed by the command that prints it): moving a setting from one place to another must not change a
single value, type or key order. A value changed on purpose shows up here, and its snapshot is written again
with

    python -m tests.core.test_cfg_snapshots [NAME ...]

so the change is seen in review. Composed in this process with Hydra's compose API (76 configs in
seconds); one test checks that this is byte for byte what the CLI prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.core.registry import CONF_DIR, experiment_names
from tests.helpers.in_process import compose_config

SNAPSHOTS = Path(__file__).parent / "cfg_snapshots"
PRESETS = sorted(p.stem for p in (CONF_DIR / "preset").glob("*.yaml"))


def job_config(name: str, preset: str) -> str:
    """What `icl-exp run NAME preset=PRESET --cfg job` prints (Hydra's own key left out)."""
    return OmegaConf.to_yaml(compose_config(name, f"preset={preset}"))


def snapshot(name: str) -> Path:
    return SNAPSHOTS / f"{name}.yaml"


def heading(name: str, preset: str) -> str:
    """The comment line that opens a preset's section: the command whose output the section is."""
    return f"# icl-exp run {name} preset={preset} --cfg job\n"


def written(name: str) -> str:
    """An experiment's snapshot file as the command below writes it: every preset's section, in order."""
    return "".join(heading(name, p) + job_config(name, p) for p in PRESETS)


def sections(name: str) -> dict[str, str]:
    """preset -> its section of the experiment's snapshot file (the yaml alone, its heading left out)."""
    text = snapshot(name).read_text(encoding="utf-8")
    found = {}
    for part in text.split(f"# icl-exp run {name} preset=")[1:]:
        preset, _, rest = part.partition(" --cfg job\n")
        found[preset] = rest
    return found


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", experiment_names())
def test_composed_config_is_unchanged(name, preset):
    path = snapshot(name)
    assert path.is_file(), f"no snapshot {path.name}: write it with python -m tests.core.test_cfg_snapshots {name}"
    assert job_config(name, preset) == sections(name).get(preset), f"{path.name}, preset={preset}"


def test_snapshots_are_what_the_cli_prints(icl_inprocess_cfg):
    """The compose API above and the CLI's `--cfg job` agree, so the snapshots hold the CLI's output."""
    assert icl_inprocess_cfg("linreg_icl", "smoke") == sections("linreg_icl")["smoke"]


def test_no_snapshot_is_left_over():
    """A snapshot of an experiment or preset that is gone would check nothing."""
    assert {p.name for p in SNAPSHOTS.glob("*.yaml")} <= {snapshot(n).name for n in experiment_names()}
    for name in experiment_names():
        if snapshot(name).is_file():
            assert list(sections(name)) == PRESETS, snapshot(name).name


@pytest.fixture
def icl_inprocess_cfg(tmp_path, capsys):
    """`icl-exp run NAME preset=P --cfg job`'s standard output, the CLI run in this process."""
    from cli.main import app

    def cfg_job(name: str, preset: str) -> str:
        capsys.readouterr()
        argv = list(sys.argv)  # the CLI hands Hydra its argv
        try:
            app(["run", name, f"preset={preset}", "--cfg", "job", f"hydra.run.dir={tmp_path / name}"],
                standalone_mode=False)
        finally:
            sys.argv = argv
        return capsys.readouterr().out

    return cfg_job


if __name__ == "__main__":  # write the snapshots again: all of them, or those of the experiments named
    SNAPSHOTS.mkdir(exist_ok=True)
    for experiment in sys.argv[1:] or experiment_names():
        snapshot(experiment).write_text(written(experiment), encoding="utf-8")
        print(snapshot(experiment))
