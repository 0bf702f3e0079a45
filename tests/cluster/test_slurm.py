"""Sweeps through the real `hydra/launcher=slurm` (hydra-submitit-launcher) on a one-node SLURM cluster
started on this machine (conftest.py): a sweep completes; a failing job leaves its sibling complete and
the sweep exits 1, and `icl-exp resume` runs that job alone; sbatch's refusal is one line; `scancel`
leaves run.json `interrupted`; gpt_wq as two gloo ranks under srun + torchrun takes the same steps as one
process."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd

from tests.helpers.cli import cli_command, run_cli, start_cli
from tests.helpers.repo import REPO_ROOT
from tests.helpers.sweeps import user_error_for_seed

SMALL = ("preset=smoke", "train.steps=2", "eval.grid_tasks=1")
ONE_CPU = ("hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2")  # both jobs at once on a 2-core node


def _cli(slurm, *args: str, env: dict | None = None, background: bool = False):
    """`icl-exp ARGS` against the session's cluster; the launcher picks the device (cpu=False)."""
    full_env = {"OMP_NUM_THREADS": "1", **(env or {}), **slurm.env}
    if background:
        return start_cli(*args, env=full_env, cpu=False)
    return run_cli(*args, env=full_env, timeout=300, cpu=False)


def _status(job_dir: Path) -> dict:
    return json.loads((job_dir / "run.json").read_text())


def _no_poll_noise(out: str) -> None:
    """submitit's sacct fails without accounting; it must not warn at every poll (nor once)."""
    assert "sacct" not in out and "Bypassing" not in out and "Traceback" not in out, out[-3000:]


def test_a_two_job_sweep_completes_without_asking_for_a_gpu(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "linreg_icl", "-m", "hydra/launcher=slurm", *SMALL, *ONE_CPU, "seed=0,1",
                f"hydra.sweep.dir={sweep}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert [_status(sweep / j)["status"] for j in ("0", "1")] == ["complete", "complete"]
    assert "all 2 jobs complete" in out
    _no_poll_noise(out)
    script = next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "--cpus-per-task=1" in script and "gpu" not in script.lower()  # linreg_icl needs no GPU


def test_a_failing_job_is_marked_failed_and_its_sibling_completes(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "linreg_icl", "-m", "hydra/launcher=slurm", *SMALL, *ONE_CPU, "seed=0,1",
                f"hydra.sweep.dir={sweep}", env=user_error_for_seed(tmp_path, 1))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert _status(sweep / "0")["status"] == "complete"
    failed = _status(sweep / "1")
    assert failed["status"] == "failed" and "deliberate failure for seed 1" in failed["error"]
    line = next(ln for ln in out.splitlines() if ln.startswith("job 1 ("))
    assert "seed=1" in line and "deliberate failure" in line
    assert "1 of 2 jobs failed" in out
    assert pd.read_csv(sweep / "claims.csv").job.astype(str).unique().tolist() == ["0"]
    _no_poll_noise(out)


def test_a_sweep_with_a_failed_job_resumes_that_job_alone_on_slurm(slurm, tmp_path):
    """`icl-exp resume`: the failed job runs again through SLURM in its own folder, the complete one stays."""
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "linreg_icl", "-m", "hydra/launcher=slurm", *SMALL, *ONE_CPU, "seed=0,1",
                f"hydra.sweep.dir={sweep}", env=user_error_for_seed(tmp_path, 1))
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    kept = _status(sweep / "0")
    submitted = set((sweep / ".submitit").iterdir())
    resumed = _cli(slurm, "resume", str(sweep))
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {sweep}: job 1 of 2" in out
    assert set((sweep / ".submitit").iterdir()) > submitted  # submitted to SLURM again, as the sweep was
    assert _status(sweep / "0") == kept and _status(sweep / "1")["status"] == "complete"
    assert "all 2 jobs complete" in out
    assert pd.read_csv(sweep / "claims.csv").n_seeds.tolist() == [2] * len(pd.read_csv(sweep / "0" / "claims.csv"))
    _no_poll_noise(out)


def test_a_gpu_experiment_asks_for_a_gpu_and_the_refusal_is_one_line_with_the_fix(slurm, tmp_path):
    """basis_transfer at its paper settings is a GPU job: it asks for one, and this cluster has none."""
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "basis_transfer", "-m", "hydra/launcher=slurm", "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "sbatch refused" in lines[0] and "Invalid generic resource" in lines[0]
    assert "hydra.launcher.gpus_per_node=0" in lines[0]
    assert not sweep.exists()  # nothing half-written


def test_a_job_that_can_never_start_is_cancelled_in_one_line(slurm, tmp_path):
    """More CPUs than the node has: sbatch accepts it, squeue keeps it pending (PartitionConfig) forever."""
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "linreg_icl", "-m", "hydra/launcher=slurm", *SMALL, "seed=0,1",
                f"hydra.launcher.cpus_per_task={slurm.cpus + 1}", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "will never start" in lines[0] and "cpus_per_task" in lines[0], proc.stderr
    assert slurm.run("squeue", "-h").stdout.strip() == ""  # cancelled, not left in the queue
    assert not sweep.exists()


def test_scancel_of_a_running_job_leaves_run_json_interrupted(slurm, tmp_path):
    """The job waits in its training loop (ICL_EXP_PAUSE_AT) until scancel's SIGTERM, at any speed."""
    sweep = tmp_path / "sweep"
    proc = _cli(slurm, "run", "linreg_icl", "-m", "hydra/launcher=slurm", *SMALL, *ONE_CPU, "seed=0",
                f"hydra.sweep.dir={sweep}", env={"ICL_EXP_PAUSE_AT": "train 1"}, background=True)
    try:
        deadline = time.monotonic() + 600  # only against a hang: the test waits on the job's pause line
        while not _paused(sweep):
            assert time.monotonic() < deadline and proc.poll() is None, "the job never reached train 1/2"
            time.sleep(0.5)
        job_ids = slurm.run("squeue", "-h", "-o", "%A").stdout.split()
        assert len(job_ids) == 1
        assert slurm.run("scancel", job_ids[0]).returncode == 0
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out + err)[-3000:]
    record = _status(sweep / "0")
    assert record["status"] == "interrupted" and "SIGTERM" in record["error"], record
    assert record["stopped_at"] == "train 1/2", record
    assert "job 0" in err and "interrupted" in err
    _no_poll_noise(out + err)


def _paused(sweep: Path) -> bool:
    """The job says, in its stderr log (submitit's .submitit/<job>/<job>_0_log.err), that it waits there."""
    return any("paused at train 1/2" in log.read_text(errors="replace")
               for log in (sweep / ".submitit").glob("*/*.err"))


def test_gpt_wq_two_gloo_ranks_under_srun_and_torchrun_match_one_process(slurm, tmp_path):
    args = ("preset=smoke", "train.decay_steps=6", "export_hf=false", "train.grad_accum=2",
            f"cache_dir={tmp_path / 'cache'}")
    single = _cli(slurm, "run", "gpt_wq", *args, f"hydra.run.dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-3000:]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    ddp = slurm.run("srun", "--ntasks=1", "--cpus-per-task=2", "--mem=4G", "--time=10",
                    *cli_command("run", "gpt_wq", *args, f"hydra.run.dir={tmp_path / 'ddp'}", cpu=False,
                                 launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")),
                    env=env, cwd=REPO_ROOT, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for metric in ("train_loss", "val_loss"):
        one, two = (_curve(tmp_path / d, metric) for d in ("single", "ddp"))
        assert len(one) > 1 and one.index.equals(two.index)
        assert (one - two).abs().max() < 1e-5, metric
    assert _curve(tmp_path / "ddp", "world_size").iloc[0] == 2
    assert _status(tmp_path / "ddp")["status"] == "complete"


def _curve(run_dir: Path, metric: str) -> pd.Series:
    m = pd.read_csv(run_dir / "metrics.csv")
    return m[m["metric"] == metric].set_index("step")["value"]


def test_the_cluster_helper_stops_the_daemons_it_started_by_pid(slurm, tmp_path):
    """A second cluster (own ports, state, munge socket) next to the session's: started, then stopped."""
    from tests.cluster.local_slurm import LocalSlurm

    cluster = LocalSlurm(tmp_path / "second").start()
    pids = cluster.pids()
    assert list(pids) == ["munged", "slurmctld", "slurmd"]
    assert all(_alive(pid) for pid in pids.values())
    cluster.stop()
    assert not any(_alive(pid) for pid in pids.values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a child that exited but was not reaped yet is a zombie: not running
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().split(") ")[-1][:1] != "Z"
