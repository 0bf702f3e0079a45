"""Precision pinned and recorded (experiments/core/precision.py): every run sets IEEE float32 for matmuls and
cuDNN unless its config asks for tf32, whatever the process set before (a notebook's
`set_float32_matmul_precision("high")`), and run.json says what ran; NVIDIA_TF32_OVERRIDE, which torch cannot
undo, makes a float32 CUDA run's record say tf32, with a note. Checked on the CPU: the flags are torch's
own, read back after the runner's setup; the CUDA device is faked where the runner asks which it is."""

from __future__ import annotations

import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from experiments.core import precision, registry, runner
from experiments.core.registry import Experiment


@pytest.fixture(autouse=True)
def restore_torch_precision():
    """Leave the process's precision as the test found it (IEEE: other tests' tolerances assume it)."""
    yield
    precision.set_tf32(False)
    precision.set_deterministic(False)


def _probe(seen: dict) -> Experiment:
    def run(cfg, ctx):
        seen["tf32_paths"] = precision.tf32_paths()
        seen["matmul"] = torch.get_float32_matmul_precision()
        ctx.log("probe", 1.0)

    return Experiment("nobody", "none", "records the precision it runs in", run=run, plot=lambda m, d: [],
                      name="probe")


def _run(tmp_path, monkeypatch, cuda: bool = False, **keys) -> tuple[dict, dict]:
    seen: dict = {}
    monkeypatch.setattr(registry, "get", lambda name: _probe(seen))
    if cuda:  # the runner asks which device; nothing here touches a GPU
        monkeypatch.setattr(runner, "resolve_device", lambda name: torch.device("cuda", 0))
        monkeypatch.setattr(runner, "use_device", lambda device: device)
        monkeypatch.setattr(runner, "describe_device", lambda device: "cuda:0 (Fake GPU)")
    cfg = OmegaConf.create({"seed": 0, "device": "cpu", "dtype": "float32", **keys})
    runner.run("probe", cfg, tmp_path, "r1", [])
    return json.loads((tmp_path / "run.json").read_text()), seen


def test_a_notebooks_tf32_is_reset_by_the_run_and_said(tmp_path, monkeypatch):
    monkeypatch.delenv(precision.TF32_ENV, raising=False)
    precision.set_tf32(True)  # as torch.set_float32_matmul_precision("high") in a notebook before the Python API
    assert precision.tf32_paths()
    record, seen = _run(tmp_path, monkeypatch)
    assert seen == {"tf32_paths": [], "matmul": "highest"}  # IEEE for the experiment's whole body
    assert record["precision"] == "float32 (IEEE)"
    assert any("TF32 had been turned on" in note for note in record["notes"]), record.get("notes")


def test_float64_and_bfloat16_runs_say_what_ran(tmp_path, monkeypatch):
    record, seen = _run(tmp_path / "f64", monkeypatch, dtype="float64")
    assert record["precision"] == "float64 (IEEE)" and seen["tf32_paths"] == []
    record, _ = _run(tmp_path / "bf16", monkeypatch, dtype="bfloat16")
    assert record["precision"] == "bfloat16"


def test_tf32_only_where_the_config_asks(tmp_path, monkeypatch):
    record, seen = _run(tmp_path, monkeypatch, tf32=True)
    assert record["precision"] == "tf32" and "cuBLAS matmul" in seen["tf32_paths"]


@pytest.mark.parametrize("value, cuda, expected", [("1", True, "tf32 (NVIDIA_TF32_OVERRIDE=1)"),
                                                   ("0", True, "float32 (IEEE)"),  # 0 forces IEEE: what is pinned
                                                   ("1", False, "float32 (IEEE)")])  # NVIDIA's libraries: CUDA only
def test_nvidia_tf32_override_is_recorded_as_tf32_on_cuda(tmp_path, monkeypatch, value, cuda, expected):
    monkeypatch.setenv(precision.TF32_ENV, value)
    record, _ = _run(tmp_path, monkeypatch, cuda=cuda)
    assert record["precision"] == expected
    notes = record.get("notes", [])
    assert any("torch cannot undo" in note for note in notes) == expected.startswith("tf32"), notes


def test_an_experiments_mixed_precision_is_kept_and_a_bare_dtype_is_not(tmp_path, monkeypatch):
    ctx_precision = {}

    def run(cfg, ctx):
        ctx.precision = ctx_precision["value"]
        ctx.log("probe", 1.0)

    monkeypatch.setattr(registry, "get", lambda name: Experiment("n", "none", "p", run=run, name="probe",
                                                                 plot=lambda m, d: []))
    for value, expected in (("bfloat16 autocast, float32 weights", "bfloat16 autocast, float32 weights"),
                            ("float32", "float32 (IEEE)")):
        ctx_precision["value"] = value
        runner.run("probe", OmegaConf.create({"seed": 0, "device": "cpu", "dtype": "float32"}), tmp_path, "r", [])
        assert json.loads((tmp_path / "run.json").read_text())["precision"] == expected


def test_an_experiment_that_computes_in_one_place_is_recorded_as_it_ran(tmp_path, monkeypatch):
    """wq_reparam computes in float64 on the CPU whatever the device: run.json said `cuda:0`, `float32`. Its
    declaration (`computes_in`) gives the run that device and dtype, and the record follows; a CUDA ask
    is noted. device=cuda would be refused on this machine if the runner still resolved it."""
    import dataclasses

    assert registry.get("wq_reparam").computes_in == ("cpu", "float64")
    seen: dict = {}
    probe = dataclasses.replace(_probe(seen), computes_in=("cpu", "float64"))
    monkeypatch.setattr(registry, "get", lambda name: probe)
    cfg = OmegaConf.create({"seed": 0, "device": "cuda", "dtype": "float32"})
    runner.run("probe", cfg, tmp_path, "r1", [])
    record = json.loads((tmp_path / "run.json").read_text())
    assert (record["device"], record["dtype"], record["precision"]) == ("cpu", "float64", "float64 (IEEE)")
    assert any("computes in float64 on the cpu" in note for note in record["notes"]), record.get("notes")


def test_deterministic_kernels_where_a_config_asks_and_only_there(tmp_path, monkeypatch):
    """gpt_wq's deterministic=true (bit-equal resumes and DDP ranks on CUDA): torch's deterministic algorithms
    and cuBLAS's deterministic workspace for that run, said in run.json; the next run is back to the default."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that the test's end restores what was there
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen: dict = {}

    def run(cfg, ctx):
        seen["deterministic"] = torch.are_deterministic_algorithms_enabled()
        ctx.log("probe", 1.0)

    monkeypatch.setattr(registry, "get", lambda name: Experiment("n", "none", "p", run=run, name="probe",
                                                                 plot=lambda m, d: []))
    cfg = OmegaConf.create({"seed": 0, "device": "cpu", "dtype": "float32", "deterministic": True})
    runner.run("probe", cfg, tmp_path / "a", "r", [])
    assert seen["deterministic"] and json.loads((tmp_path / "a" / "run.json").read_text())["precision"] == \
        "float32 (IEEE), deterministic"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    runner.run("probe", OmegaConf.merge(cfg, {"deterministic": False}), tmp_path / "b", "r", [])
    assert not seen["deterministic"] and not torch.are_deterministic_algorithms_enabled()
    from experiments.karbevski.gpt_wq import GptWqConfig

    assert GptWqConfig.deterministic is False and GptWqConfig.tf32 is False
