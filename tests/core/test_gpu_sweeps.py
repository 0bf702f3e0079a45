"""A local sweep on a GPU box (hydra/launcher=parallel, experiments/core/parallel_launcher.py): CUDA jobs
run one per GPU, N at a time on N GPUs, job k on cuda:(k mod N); CPU sweeps are as they were. Checked
without a GPU: tests/core/fake_gpus/sitecustomize.py fakes the GPUs in every process of a real sweep
(the CLI and joblib's worker processes) and replaces the experiment's body with a probe that records
where each job ran and how many ran at once (an event counter, not a clock)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from experiments.core.errors import UserError
from tests.helpers.cli import run_cli
from tests.helpers.repo import REPO_ROOT

pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="the joblib extra: pip install -e '.[joblib]'")

from experiments.core.parallel_launcher import CPU_N_JOBS, lanes_of, plan_gpus  # noqa: E402

FAKES = Path(__file__).parent / "fake_gpus"
GIB = 1 << 30


def _sweep(tmp_path: Path, gpus: int, expect: int, *args: str) -> subprocess.CompletedProcess:
    """`icl-exp run linreg_icl -m hydra/launcher=parallel ARGS` with `gpus` fake GPUs (0: none) and the probe."""
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO_ROOT)]), "ICL_EXP_FAKE_GPUS": str(gpus),
           "ICL_EXP_PROBE": str(probe), "ICL_EXP_PROBE_EXPECT": str(expect)}
    return run_cli("run", "linreg_icl", "-m", "hydra/launcher=parallel", "preset=smoke", *args,
                   f"hydra.sweep.dir={tmp_path / 'sweep'}", env=env, cpu=False)  # device=auto sees the fakes


def _jobs(tmp_path: Path, n: int) -> list[tuple[dict, dict]]:
    """(run.json, the probe's record) of jobs 0..n-1."""
    return [(json.loads((tmp_path / "sweep" / str(k) / "run.json").read_text()),
             json.loads((tmp_path / "probe" / f"job-{k}.json").read_text())) for k in range(n)]


def _most_at_once(tmp_path: Path) -> int:
    return json.loads((tmp_path / "probe" / "state.json").read_text())["most"]


def test_a_sweep_on_three_gpus_runs_three_jobs_at_once_job_k_on_gpu_k_mod_3(tmp_path):
    """Three GPUs (not 2, the CPU default), five jobs (the assignment wraps), device=auto (the default)."""
    proc = _sweep(tmp_path, 3, 3, "seed=0,1,2,3,4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "n_jobs=3" in out and "one per GPU at a time (3 GPUs here)" in out
    jobs = _jobs(tmp_path, 5)
    for k, (record, seen) in enumerate(jobs):
        gpu = k % 3
        assert record["status"] == "complete" and record["device"] == f"cuda:{gpu} (Fake GPU {gpu})"
        assert seen["device"] == f"cuda:{gpu}" and seen["current_gpu"] == gpu  # tensors and bare "cuda" alike
        assert seen["free_bytes"] == (gpu + 1) * GIB  # the model's memory check asked the job's own GPU
    assert _most_at_once(tmp_path) == 3
    for a, other in ((a, b) for a in jobs for b in jobs if a is not b):  # never two jobs on one GPU at a time
        if a[1]["device"] == other[1]["device"]:
            assert a[1]["end"] < other[1]["start"] or other[1]["end"] < a[1]["start"], (a[1], other[1])


def test_a_cpu_sweep_keeps_its_two_jobs_at_a_time_on_the_cpu(tmp_path):
    """No GPU (the suite hides CUDA), device=auto: joblib as before, CPU_N_JOBS at a time, every job on cpu."""
    assert CPU_N_JOBS == 2
    proc = _sweep(tmp_path, 0, 2, "seed=0,1,2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Joblib.Parallel(n_jobs=2," in out and "per GPU" not in out
    for record, seen in _jobs(tmp_path, 3):
        assert record["device"] == "cpu" and seen["device"] == "cpu"
    assert _most_at_once(tmp_path) == 2


def test_n_jobs_above_the_gpus_is_one_line_before_any_job_starts(tmp_path):
    proc = _sweep(tmp_path, 3, 3, "seed=0,1", "hydra.launcher.n_jobs=4")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "hydra.launcher.n_jobs=4 for jobs on CUDA, with 3 GPUs here" in lines[0]
    assert not (tmp_path / "sweep").exists() and not list((tmp_path / "probe").iterdir())


# -- the plan and the checks, in this process -------------------------------------------------------------------
def test_the_plan_one_gpu_per_job_at_a_time():
    assert plan_gpus(["cpu", "cpu"], 0, 8, None) is None  # CPU jobs: joblib as it comes
    assert plan_gpus(["cuda"] * 5, 0, 3, None) == [0, 1, 2, 0, 1]
    assert plan_gpus(["cuda"] * 3, 4, 3, None) == [1, 2, 0]  # numbered as Hydra numbers them (job.num)
    assert plan_gpus(["cuda"] * 5, 0, 8, 2) == [0, 1, 0, 1, 0]  # n_jobs given: that many GPUs
    assert plan_gpus(["cuda:2", "cuda", "cpu", "cuda"], 0, 3, None) == [2, 1, None, 0]  # cuda:K pinned by hand
    assert lanes_of([2, 1, None, 0], 0, 3) == {0: [3], 1: [1], 2: [0, 2]}  # CPU job 2 joins lane 2 mod 3
    assert lanes_of([0, 1, 0, 1, 0], 0, 2) == {0: [0, 2, 4], 1: [1, 3]}


@pytest.mark.parametrize(("devices", "n_jobs", "said"), [
    (["cuda", "cuda"], 4, "hydra.launcher.n_jobs=4 for jobs on CUDA, with 3 GPUs here"),
    (["cuda:0", "cuda:1"], 5, "hydra.launcher.n_jobs=5 for jobs on CUDA"),
    (["cuda"], -1, "hydra.launcher.n_jobs=-1 for jobs on CUDA"),
])
def test_what_the_plan_cannot_honour_is_one_line(devices, n_jobs, said):
    with pytest.raises(UserError) as err:
        plan_gpus(devices, 0, 3, n_jobs)
    assert said in str(err.value) and "\n" not in str(err.value)


@pytest.fixture
def three_gpus(monkeypatch):
    """Three CUDA GPUs as far as this process's checks can tell (the sweeps above fake them in every process)."""
    current = [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.__setitem__(0, torch.device(d).index))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: f"Fake GPU {torch.device(d).index}")
    return current


def test_the_cli_checks_the_sweep_before_hydra_starts(three_gpus):
    from cli.overrides import validate

    sweep = ["preset=smoke", "hydra/launcher=parallel", "seed=0,1"]
    assert validate("linreg_icl", [*sweep, "hydra.launcher.n_jobs=2"], multirun=True)  # 2 of 3 GPUs: fine
    with pytest.raises(UserError, match="n_jobs=4 for jobs on CUDA"):
        validate("linreg_icl", [*sweep, "hydra.launcher.n_jobs=4"], multirun=True)
    with pytest.raises(UserError, match=r"device=cuda:7: there are 3 GPUs here \(cuda:0 to cuda:2\)"):
        validate("linreg_icl", [*sweep, "device=cuda:7"], multirun=True)
    validate("linreg_icl", [*sweep, "device=cpu", "hydra.launcher.n_jobs=4"], multirun=True)  # CPU jobs: any n_jobs


def test_device_cuda_k_past_the_gpus_is_one_line_for_a_single_run_too(three_gpus):
    from experiments.core.runtime import resolve_device

    assert resolve_device("cuda:2") == torch.device("cuda", 2)
    for bad, said in (("cuda:3", r"device=cuda:3: there are 3 GPUs here \(cuda:0 to cuda:2\)"),
                      ("cuda:x", "is not a device")):
        with pytest.raises(UserError, match=said):
            resolve_device(bad)


def test_a_run_names_its_gpu_and_makes_it_current(three_gpus):
    """What the runner does with a job's device (experiments/core/runtime.py): `cuda` is the current GPU,
    the one the parallel launcher set, made explicit; cuda:K becomes current."""
    from experiments.core.runtime import describe_device, use_device

    three_gpus[0] = 2  # the launcher's set_device(2) in the worker
    assert use_device(torch.device("cuda")) == torch.device("cuda", 2)
    assert describe_device(torch.device("cuda", 2)) == "cuda:2 (Fake GPU 2)"
    assert use_device(torch.device("cuda", 1)) == torch.device("cuda", 1) and three_gpus[0] == 1
    assert use_device(torch.device("cpu")) == torch.device("cpu") and three_gpus[0] == 1


def test_the_parallel_launcher_is_refused_under_torchrun(monkeypatch):
    """A torchrun job spans its ranks' GPUs: it is not split across parallel workers (rank 0 says it)."""
    from cli.overrides import validate

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError, match="hydra/launcher=parallel under torchrun.*hydra/launcher=slurm"):
        validate("linreg_icl", ["preset=smoke", "hydra/launcher=parallel", "seed=0,1"], multirun=True)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit):
        validate("linreg_icl", ["preset=smoke", "hydra/launcher=parallel", "seed=0,1"], multirun=True)


@pytest.mark.gpu
def test_a_real_sweep_on_the_gpus_here_puts_job_k_on_gpu_k_mod_n(tmp_path):
    """On a GPU machine (pytest -m gpu): the real experiment, no fakes, each job on its own GPU."""
    sweep = tmp_path / "sweep"
    proc = run_cli("run", "linreg_icl", "-m", "hydra/launcher=parallel", "preset=smoke", "seed=0,1,2",
                   "train.steps=2", "eval.grid_tasks=1", "device=cuda", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = torch.cuda.device_count()
    for k in range(3):
        record = json.loads((sweep / str(k) / "run.json").read_text())
        assert record["status"] == "complete" and record["device"].startswith(f"cuda:{k % n} ("), record["device"]
