"""The SLURM launcher's decisions, without a cluster: which jobs ask for a GPU, what a null resource
becomes, how sbatch's refusal is worded, and what a job that SLURM ended leaves in run.json.
(tests/cluster/ runs the launcher itself on a local cluster.)"""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra: pip install -e '.[slurm]'")

from experiments.core.config_store import register_schemas  # noqa: E402
from experiments.core.registry import CONF_DIR  # noqa: E402
from experiments.core.slurm_launcher import (  # noqa: E402
    CPU_JOB,
    GPU_JOB,
    _mark_ended,
    needs_gpu,
    refusal_line,
    resources_for,
)


def _cfg(experiment: str, preset: str = "paper", *overrides: str):
    register_schemas()  # the schemas hold the keys and their defaults
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[f"experiment={experiment}", f"preset={preset}",
                                             "hydra/launcher=slurm", *overrides], return_hydra_config=True)


def test_slurm_yaml_leaves_resources_to_the_experiment_and_targets_the_project_launcher():
    launcher = _cfg("linreg_icl").hydra.launcher
    assert launcher.gpus_per_node is None and launcher.cpus_per_task is None and launcher.mem_gb is None
    from hydra.utils import get_class

    assert get_class(launcher._target_).__mro__[1].__module__ == "experiments.core.slurm_launcher"


@pytest.mark.parametrize(("experiment", "preset", "overrides", "gpu"), [
    ("linreg_icl", "paper", (), False),            # a CPU experiment at its paper settings
    ("linreg_icl", "paper", ("device=cuda",), True),
    ("gpt_wq", "paper", (), True),                 # require_gpu
    ("gpt_wq", "smoke", (), False),
    ("gpt_wq", "paper", ("device=cpu",), False),
    ("gemma_match", "paper", (), True),            # sized for a GPU
    ("gemma_match", "cpu", (), False),
    ("basis_transfer", "paper", (), True),
])
def test_a_job_asks_for_a_gpu_only_when_it_will_run_on_one(experiment, preset, overrides, gpu):
    assert needs_gpu(_cfg(experiment, preset, *overrides)) is gpu


def test_null_resources_follow_the_experiment_and_given_ones_win():
    params = OmegaConf.to_container(_cfg("linreg_icl").hydra.launcher, resolve=False)
    filled = resources_for(_cfg("linreg_icl"), params)
    assert (filled["gpus_per_node"], filled["cpus_per_task"], filled["mem_gb"]) == CPU_JOB
    filled = resources_for(_cfg("gpt_wq"), params)
    assert (filled["gpus_per_node"], filled["cpus_per_task"], filled["mem_gb"]) == GPU_JOB
    given = resources_for(_cfg("gpt_wq"), {**params, "gpus_per_node": 4, "mem_gb": 500})
    assert (given["gpus_per_node"], given["cpus_per_task"], given["mem_gb"]) == (4, GPU_JOB[1], 500)
    assert "OMP_NUM_THREADS" in filled["setup"][0]


@pytest.mark.parametrize(("stderr", "fix"), [
    ("sbatch: error: Invalid generic resource (gres) specification", "hydra.launcher.gpus_per_node=0"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", "hydra.launcher.partition="),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "hydra.launcher.mem_gb=4"),
])
def test_an_sbatch_refusal_is_one_line_with_its_reason_and_fix(stderr, fix):
    line = refusal_line(RuntimeError(f"some preamble\n{stderr}"), {"cpus_per_task": 8, "mem_gb": 64})
    assert "\n" not in line
    assert stderr.split("error: ", 1)[1] in line and fix in line


def test_a_job_slurm_killed_is_marked_failed_but_an_interrupted_one_stays_interrupted(tmp_path):
    for name, status in (("killed", "running"), ("cancelled", "interrupted")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"status": status}))
    assert _mark_ended(tmp_path / "killed", "failed", "SLURM ended it", "linreg_icl", []) == "failed"
    assert json.loads((tmp_path / "killed" / "run.json").read_text())["error"] == "SLURM ended it"
    assert _mark_ended(tmp_path / "cancelled", "failed", "SLURM ended it", "linreg_icl", []) == "interrupted"
    # cancelled while pending: no folder yet; the sweep's summary still counts it
    assert _mark_ended(tmp_path / "never", "failed", "SLURM ended it", "linreg_icl", ["seed=3"]) == "failed"
    assert json.loads((tmp_path / "never" / "run.json").read_text())["overrides"] == ["seed=3"]


def test_sigterm_interrupts_a_run_under_submitits_bypass_handler():
    """In a SLURM job submitit only logs SIGTERM; the run must take it (scancel -> run.json interrupted),
    and give the handler back after."""
    import os
    import signal

    from submitit.core.job_environment import SignalHandler

    from experiments.core.runner import Terminated, _sigterm_interrupts

    bypass = SignalHandler(None, None, None).bypass
    before = signal.signal(signal.SIGTERM, bypass)
    try:
        with pytest.raises(Terminated), _sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
        assert signal.getsignal(signal.SIGTERM) == bypass
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_login_node_without_cuda_can_submit_gpu_jobs_and_the_job_checks_its_own_node():
    """The CLI's CUDA checks are about this machine; with hydra/launcher=slurm the jobs run on others."""
    from cli.overrides import validate
    from experiments.core.errors import UserError

    with pytest.raises(UserError, match="needs CUDA"):
        validate("gpt_wq", ["data=shakespeare"], multirun=True)
    with pytest.raises(UserError, match="CUDA is not available"):
        validate("linreg_icl", ["device=cuda"], multirun=True)
    validate("gpt_wq", ["data=shakespeare", "hydra/launcher=slurm"], multirun=True)
    validate("linreg_icl", ["device=cuda", "hydra/launcher=slurm"], multirun=True)
    # in the job, on a node without CUDA, gpt_wq still refuses (run.json: failed, with this line)
    from experiments.karbevski.gpt_wq.run import require_cuda

    with pytest.raises(UserError, match="needs CUDA"):
        require_cuda(_cfg("gpt_wq"), cuda=False)
    require_cuda(_cfg("gpt_wq"), cuda=True)
