"""hydra-submitit-launcher's SLURM launcher, with what a sweep here needs around it:

- resources follow the experiment: a job that will run on CUDA asks for one GPU, any other for none
  (`resources_for`); every value stays one `hydra.launcher.KEY=...` away;
- sbatch refusing a job is one line with sbatch's reason and the override that fixes it, and no sweep
  folder is left behind;
- the jobs are watched with squeue, not sacct: on a cluster without accounting sacct fails, and submitit
  would warn at every poll; a job that SLURM ended without a result (scancel, time limit, out of memory)
  still ends the wait, and its run.json says so (`interrupted` when the job caught the signal,
  `failed` when it was killed outright);
- the sweep then ends as with the local launchers: one line per job that did not complete, exit 1
  (experiments/core/callbacks.py), never a traceback from the launcher.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

# Experiments whose paper settings are meant for a GPU (docs/usage.md: gemma_match, basis_transfer, gpt_wq).
GPU_EXPERIMENTS = frozenset({"gemma_match", "basis_transfer", "gpt_wq"})
GPU_PRESETS = frozenset({"paper", "gpu"})
# Resources when slurm.yaml leaves them null: (gpus_per_node, cpus_per_task, mem_gb)
CPU_JOB = (None, 2, 8)
GPU_JOB = (1, 8, 64)
POLL_S = 2.0


def needs_gpu(cfg: DictConfig) -> bool:
    """Will this job run on CUDA? device=cuda says yes and device=cpu no; device=auto takes a GPU
    when there is one, so a job asks for one when the experiment needs it (require_gpu) or its preset
    is sized for one (gemma_match, basis_transfer, gpt_wq at preset=paper / gpu)."""
    device = cfg.device.lower()
    if device.startswith("cuda"):
        return True
    if device == "cpu":
        return False
    choices = cfg.hydra.runtime.choices if "hydra" in cfg else {}
    experiment, preset = choices.get("experiment"), choices.get("preset", "paper")
    # require_gpu: a key only the experiments too large for a CPU declare (gpt_wq)
    return getattr(cfg, "require_gpu", False) or (experiment in GPU_EXPERIMENTS and preset in GPU_PRESETS)


def resources_for(cfg: DictConfig, params: dict[str, Any]) -> dict[str, Any]:
    """Fill the resource keys slurm.yaml leaves null from what the job needs; a value given is kept."""
    gpus, cpus, mem = GPU_JOB if needs_gpu(cfg) else CPU_JOB
    filled = dict(params)
    for key, value in (("gpus_per_node", gpus), ("cpus_per_task", cpus), ("mem_gb", mem)):
        if filled.get(key) is None:
            filled[key] = value
    if filled.get("setup") is None:  # torch takes as many threads as SLURM gave the task, not the node's cores
        filled["setup"] = ["export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"]
    return filled


def refusal_line(error: BaseException, params: dict[str, Any]) -> str:
    """sbatch's reason in one line, with the override that would fix it."""
    text = str(error)
    reasons = [ln.strip() for ln in text.splitlines() if "sbatch: error:" in ln]
    reason = reasons[-1].split("sbatch: error:", 1)[1].strip() if reasons else text.strip().splitlines()[-1]
    low = reason.lower()
    if "gres" in low or "gpu" in low:
        fix = "hydra.launcher.gpus_per_node=0 (or device=cpu), or a partition with GPUs: hydra.launcher.partition=..."
    elif "partition" in low:
        fix = "hydra.launcher.partition=NAME (`sinfo -s` lists them)"
    elif "memory" in low or "node configuration" in low or "cpu" in low:
        fix = (f"smaller resources, e.g. hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=4 "
               f"(asked: {params.get('cpus_per_task')} CPUs, {params.get('mem_gb')} GB)")
    elif "time limit" in low:
        fix = "a shorter hydra.launcher.timeout_min=..."
    elif "account" in low or "qos" in low:
        fix = "hydra.launcher.account=... / hydra.launcher.qos=..."
    else:
        fix = "see conf/hydra/launcher/slurm.yaml for the hydra.launcher.* keys"
    return f"sbatch refused the sweep: {reason}; try {fix}"


def stuck_line(job: str, reason: str, params: dict[str, Any]) -> str:
    """A job SLURM accepted but will never start, in one line with what it asked and what to change."""
    asked = (f"{params.get('gpus_per_node') or 0} GPU, {params.get('cpus_per_task')} CPUs, {params.get('mem_gb')} GB, "
             f"{params.get('timeout_min')} min")
    return (f"SLURM will never start job {job} (squeue: {reason}): it asks {asked}, more than the partition allows; "
            f"the sweep's jobs were cancelled. Try smaller hydra.launcher.cpus_per_task=... mem_gb=... "
            f"gpus_per_node=... timeout_min=..., or another hydra.launcher.partition=... (`sinfo -s` lists them)")


class SlurmLauncher(_SubmititSlurmLauncher):
    """The plugin's launcher (its job side, `__call__`, runs each job unchanged); `launch` submits as the
    plugin does, with resources filled in, a one-line refusal, and a squeue-based wait."""

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        import submitit
        from hydra.core.singleton import Singleton
        from hydra.core.utils import filter_overrides

        assert self.config is not None
        params = resources_for(self.config, self.params)
        executor = submitit.AutoExecutor(cluster="slurm", folder=params["submitit_folder"],
                                         slurm_max_num_timeout=params["max_num_timeout"])
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                      if k not in ("submitit_folder", "max_num_timeout")})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        fresh = not any(p.name != "multirun.yaml" for p in sweep_dir.iterdir()) if sweep_dir.is_dir() else True
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info("SLURM sweep -> %s (per job: %s GPU, %s CPUs, %s GB%s)", sweep_dir, params["gpus_per_node"] or 0,
                 params["cpus_per_task"], params["mem_gb"],
                 f", partition {params['partition']}" if params.get("partition") else "")
        job_params = []
        for i, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + i, " ".join(filter_overrides(overrides)))
            job_params.append((list(overrides), "hydra.sweep.dir", initial_job_idx + i, f"job_id_for_{i}",
                               Singleton.get_state()))
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's error: said once, below
                jobs = executor.map_array(self, *zip(*job_params, strict=True))
        except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as err:
            if fresh:  # nothing was submitted: leave no half-made sweep folder
                shutil.rmtree(sweep_dir, ignore_errors=True)
            print(f"error: {refusal_line(err, params)}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        return self._wait(jobs, job_overrides, initial_job_idx, sweep_dir, fresh, params)

    def _wait(self, jobs: list, job_overrides, initial_job_idx: int, sweep_dir: Path, fresh: bool,
              params: dict[str, Any]) -> list[JobReturn]:
        """Wait until every job has written its result or left the queue (squeue; sacct may be off). A job
        SLURM keeps pending for a reason that no wait ends (it asks more than the partition has) is a
        refusal too: the sweep's jobs are cancelled and it ends in one line."""
        pending = {j.job_id for j in jobs}
        while pending:
            pending -= {j.job_id for j in jobs if j.job_id in pending and j.paths.result_pickle.exists()}
            if pending:
                queued = _in_queue(pending)
                pending &= set(queued)
                stuck = {j: r for j, r in queued.items() if _never_runs(r)}
                if stuck:
                    subprocess.run(["scancel", *sorted({j.split("_")[0] for j in queued})], capture_output=True)
                    if fresh:
                        shutil.rmtree(sweep_dir, ignore_errors=True)
                    print(f"error: {stuck_line(*sorted(stuck.items())[0], params)}", file=sys.stderr, flush=True)
                    raise SystemExit(2)
            if pending:
                time.sleep(POLL_S)
        return [self._job_return(job, list(overrides), sweep_dir / str(initial_job_idx + i))
                for i, (job, overrides) in enumerate(zip(jobs, job_overrides, strict=True))]

    def _job_return(self, job, overrides: list[str], job_dir: Path) -> JobReturn:
        """What the job returned; a job that left no result (SLURM ended it) is reported from its run.json."""
        import submitit

        experiment = self.config.hydra.runtime.choices.get("experiment")
        if job.paths.result_pickle.exists():
            try:
                return job.results()[0]
            except submitit.core.utils.FailedJobError as err:  # raised outside the run (Hydra, submitit)
                last = (str(err).strip().splitlines() or ["?"])[-1]
                status = _mark_ended(job_dir, "failed", f"the job raised outside the run: {last}", experiment,
                                     overrides)
        else:
            status = _mark_ended(job_dir, "failed", f"SLURM ended job {job.job_id} before it finished "
                                 f"(scancel, time limit or out of memory; its log: {job.paths.stderr})",
                                 experiment, overrides)
        ret = JobReturn(overrides=overrides, working_dir=str(job_dir), status=JobStatus.COMPLETED)
        ret.return_value = {"status": status}
        return ret


def _in_queue(job_ids: set[str]) -> dict[str, str]:
    """The jobs squeue still lists (pending, running, completing), each with squeue's reason (`None` when
    running). -r lists an array job's tasks one by one, as `ID_N`."""
    proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i %r", "-j", ",".join(sorted(job_ids))],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        # squeue says "Invalid job id specified" once every job has left the queue
        return {} if "invalid job id" in proc.stderr.lower() else dict.fromkeys(job_ids, "None")
    listed = dict(line.split(" ", 1) if " " in line else (line, "None") for line in proc.stdout.splitlines())
    return {j: listed.get(j, listed.get(j.split("_")[0], "None")) for j in job_ids
            if j in listed or j.split("_")[0] in listed}


# squeue reasons that no wait ends: the job asks for more than the partition, account or QOS allows
NEVER = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
         "InvalidQOS")


def _never_runs(reason: str) -> bool:
    return reason.startswith(NEVER) or (reason.startswith(("QOSMax", "AssocMax")) and "PerJob" in reason)


def _mark_ended(job_dir: Path, status: str, error: str, experiment: str | None, overrides: list[str]) -> str:
    """A run.json left `running` by a killed job becomes `status` with `error`; a run.json that already
    says how the run ended (interrupted, failed) is kept; a job that left no run.json gets one. The status
    the run.json ends with."""
    from experiments.core.atomic import write_json_atomic

    run_json = job_dir / "run.json"
    if not run_json.is_file():  # ended before its run began (cancelled while pending): still one job of the sweep
        job_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_json, {"experiment": experiment, "status": status, "error": error,
                                     "overrides": overrides})
        return status
    record = json.loads(run_json.read_text())
    if record.get("status") == "running":
        record.update(status=status, error=error)
        write_json_atomic(run_json, record)
    return record.get("status", status)
