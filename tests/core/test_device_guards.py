"""What keeps the suite on CPU on a GPU machine (tests/conftest.py), and what a torchrun launch does with
more ranks than GPUs: checked here without a GPU by mocking torch.cuda. One `gpu` test runs on CUDA where
there is one (pytest -m gpu)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from experiments.core import distributed
from experiments.core.errors import UserError
from tests.helpers.cli import run_cli, with_cpu_device
from tests.helpers.repo import REPO_ROOT


def test_the_suite_hides_cuda_from_itself_and_every_process_it_starts():
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""  # set in pytest_configure; children inherit it
    assert not torch.cuda.is_available()


def test_icl_exp_run_is_given_device_cpu_unless_a_test_names_a_device():
    assert with_cpu_device(("run", "linreg_icl", "preset=smoke")) == ["run", "linreg_icl", "preset=smoke",
                                                                      "device=cpu"]
    assert with_cpu_device(("run", "gemma_match", "device=cuda")) == ["run", "gemma_match", "device=cuda"]
    assert with_cpu_device(("plot", "results/x")) == ["plot", "results/x"]
    shown = run_cli("run", "linreg_icl", "preset=smoke", "--cfg", "job")
    assert shown.returncode == 0 and "device: cpu" in shown.stdout, shown.stderr[-2000:]


def test_the_gpu_marker_is_registered():
    import tomllib

    markers = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("gpu:") for m in markers)


@pytest.mark.gpu
def test_gpt_wq_trains_on_cuda_in_bfloat16_autocast(tmp_path):
    proc = run_cli("run", "gpt_wq", "preset=smoke", "device=cuda", "dtype=bfloat16", "export_hf=false",
                   f"cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["device"].startswith("cuda") and record["precision"].startswith("bfloat16 autocast")


# -- torchrun: one GPU per rank ----------------------------------------------------------------------------

@pytest.fixture
def one_gpu(monkeypatch):
    """A machine with one CUDA GPU, as far as these functions can tell."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def _ranks(monkeypatch, rank: int, world: int) -> None:
    for key, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", world)):
        monkeypatch.setenv(key, str(value))


def test_more_ranks_than_gpus_is_one_line_from_rank0_and_a_quiet_exit_elsewhere(monkeypatch, one_gpu):
    _ranks(monkeypatch, 0, 2)
    with pytest.raises(UserError) as err:
        distributed.check_gpu_count("auto")
    assert "--nproc_per_node=2" in str(err.value) and "use --nproc_per_node=1" in str(err.value)
    assert "\n" not in str(err.value)
    _ranks(monkeypatch, 1, 2)
    with pytest.raises(SystemExit) as quiet:
        distributed.check_gpu_count("cuda")
    assert quiet.value.code == 2
    distributed.check_gpu_count("cpu")  # CPU ranks need no GPU
    _ranks(monkeypatch, 0, 1)
    distributed.check_gpu_count("auto")  # one rank, one GPU


def test_each_rank_takes_cuda_local_rank_and_a_cpu_run_stays_on_cpu(monkeypatch, one_gpu):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _ranks(monkeypatch, 1, 2)
    assert distributed.local_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert one_gpu == [torch.device("cuda", 1)]
    assert distributed.local_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match="invalid|--nproc_per_node"):
        distributed.local_device(torch.device("cuda"))  # not a raw "invalid device ordinal"


def test_the_cli_refuses_more_ranks_than_gpus_before_making_a_folder(tmp_path):
    """The real `icl-exp run` as rank 0 of 2 on a (faked) one-GPU machine: one line, exit 2, no run folder.
    A sitecustomize on PYTHONPATH fakes the GPU in that process."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(textwrap.dedent("""
        import torch
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
    """))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), str(REPO_ROOT)]),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    out = tmp_path / "run"
    proc = run_cli("run", "linreg_icl", "preset=smoke", "device=auto", f"hydra.run.dir={out}", env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--nproc_per_node=1" in lines[0], proc.stderr
    assert not out.exists()
