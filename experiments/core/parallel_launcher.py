"""hydra-joblib-launcher (`hydra/launcher=parallel`), with what a local sweep on a GPU box needs: one job
per GPU at a time.

Hydra's joblib launcher knows nothing of GPUs: every job that runs on CUDA takes the current GPU, cuda:0,
so on an 8-GPU box seven sit idle while the first is shared (and with a large model the second job runs
out of memory). Here, when the sweep's jobs run on CUDA (device=cuda, or device=auto on a machine with a
GPU) and N GPUs are visible:

- N jobs run at a time (`n_jobs` left null), job k on GPU k mod N; a job given device=cuda:K runs on K;
- the jobs of one GPU run one after the other in one worker process (a lane), so two jobs never share a
  GPU and each has all of its memory. The plan is fixed before any job starts (the log says where each
  job runs, and run.json which GPU it took); the price is that a GPU whose jobs end early waits for the
  others. Lanes are joblib tasks, so joblib's `timeout` (null here) would bound a lane, not a job;
- before each job the worker calls torch.cuda.set_device(K), and the runner makes the job's device
  explicit (experiments/core/runtime.py, use_device): `cuda` becomes cuda:K, so the model, every tensor
  and the memory check land on K. Not CUDA_VISIBLE_DEVICES: joblib reuses its loky worker processes
  between jobs (and between sweeps), and CUDA reads that variable once, when a process first initialises
  it, so a reused worker would keep the GPU of the first job it ran. set_device is right whatever the
  worker ran before.

CPU jobs are launched as hydra-joblib-launcher launches them, with `n_jobs` CPU_N_JOBS unless given.
A job that spans several GPUs (gpt_wq under torchrun) is not split this way: hydra/launcher=parallel under
torchrun is refused; such sweeps run under torchrun with Hydra's basic launcher (each job on all the
ranks' GPUs, one job after another) or on SLURM (hydra/launcher=slurm).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import DictConfig

from experiments.core.errors import UserError

log = logging.getLogger(__name__)

TARGET = "hydra_plugins.icl_exp_parallel.ParallelLauncher"
CPU_N_JOBS = 2  # CPU jobs at a time when n_jobs is null: a 2-core laptop (raise it on a bigger box)


@dataclass
class ParallelLauncherConf(JobLibLauncherConf):
    """joblib's keys, `n_jobs` optional: null means one job per GPU for CUDA jobs, CPU_N_JOBS for CPU jobs."""

    _target_: str = TARGET
    n_jobs: int | None = None


def register_config() -> None:
    """conf/hydra/launcher/parallel.yaml builds on this node (`defaults: [icl_exp_parallel]`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="hydra/launcher", name="icl_exp_parallel", node=ParallelLauncherConf,
                                 provider="icl_exp")


# -- the plan: where each job runs, decided before any starts --------------------------------------------------
def job_device(cfg: DictConfig) -> str:
    """Where the job runs, as the runner will resolve it on this machine: cpu, cuda or cuda:K."""
    device = cfg.device.lower()
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def plan_gpus(devices: Sequence[str], first_job: int, gpu_count: int, n_jobs: int | None) -> list[int | None] | None:
    """The GPU of each job (None for a CPU job), jobs numbered from `first_job`; None when no job runs on
    CUDA (the sweep is launched as joblib launches it). UserError for what cannot be honoured."""
    if not any(d.startswith("cuda") for d in devices):
        return None
    if n_jobs is not None and not 1 <= n_jobs <= gpu_count:
        raise UserError(f"hydra.launcher.n_jobs={n_jobs} for jobs on CUDA, with {_gpus(gpu_count)} here: "
                        f"hydra/launcher=parallel runs one job per GPU at a time; leave n_jobs unset ({gpu_count} "
                        f"at a time) or give 1 to {gpu_count}; several jobs on one GPU: hydra/launcher=joblib "
                        f"hydra.launcher.n_jobs={n_jobs}")
    lanes = n_jobs or gpu_count
    gpus: list[int | None] = []
    for k, device in enumerate(devices, start=first_job):
        if device == "cuda":
            gpus.append(k % lanes)
        elif device.startswith("cuda:"):  # pinned by hand (past the last GPU: runtime.resolve_device's one line)
            gpus.append(int(device.split(":", 1)[1]))
        else:
            gpus.append(None)
    return gpus


def lanes_of(gpus: Sequence[int | None], first_job: int, lanes: int) -> dict[int, list[int]]:
    """Job numbers grouped by the GPU they run on, each group in job order; a CPU job joins lane k mod lanes."""
    grouped: dict[int, list[int]] = {}
    for k, gpu in enumerate(gpus, start=first_job):
        grouped.setdefault(k % lanes if gpu is None else gpu, []).append(k)
    return dict(sorted(grouped.items()))


def _refuse_under_torchrun() -> None:
    """Every torchrun rank would start its own workers, each job joining no process group: refused, in one
    line from rank 0 (the other ranks leave quietly, as distributed.check_gpu_count does)."""
    from experiments.core import distributed

    me = distributed.info()
    if not me.distributed:
        return
    if me.is_main:
        raise UserError("hydra/launcher=parallel under torchrun: a torchrun job spans its ranks' GPUs and is not "
                        "split across parallel workers; sweep it under torchrun without the launcher (its jobs "
                        "one after another, each on every rank) or on SLURM: hydra/launcher=slurm")
    raise SystemExit(2)


def check_sweep(configs: Sequence[DictConfig]) -> None:
    """The CLI's check, before any folder exists (cli/check_job.py): the same plan the launcher will make."""
    if not configs or str(configs[0].hydra.launcher.get("_target_")) != TARGET:
        return
    _refuse_under_torchrun()
    devices = [job_device(c) for c in configs]
    if any(d.startswith("cuda") for d in devices):
        import torch

        plan_gpus(devices, 0, torch.cuda.device_count(), configs[0].hydra.launcher.n_jobs)


# -- the launcher -------------------------------------------------------------------------------------------
def _run_lane(jobs, hydra_context, config, task_function, singleton_state) -> list[tuple[int, JobReturn]]:
    """In a worker: one GPU's jobs, one after the other, each with its GPU made current before it starts."""
    from hydra_plugins.hydra_joblib_launcher._core import execute_job

    returns = []
    for num, overrides, gpu in jobs:
        if gpu is not None:  # before the job's first CUDA call (see the module's docstring: not CUDA_VISIBLE_DEVICES)
            import torch

            torch.cuda.set_device(gpu)
        returns.append((num, execute_job(num, overrides, hydra_context, config, task_function, singleton_state)))
    return returns


class ParallelLauncher(JoblibLauncher):
    """The joblib launcher; `launch` spreads CUDA jobs over the GPUs, one per GPU at a time."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.hydra_joblib_launcher import _core

        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        fresh = not any(p.name != "multirun.yaml" for p in sweep_dir.iterdir()) if sweep_dir.is_dir() else True
        try:
            _refuse_under_torchrun()
            devices = [job_device(self.hydra_context.config_loader.load_sweep_config(self.config, list(o)))
                       for o in job_overrides]
            gpu_count = 0
            if any(d.startswith("cuda") for d in devices):
                import torch

                gpu_count = torch.cuda.device_count()
            gpus = plan_gpus(devices, initial_job_idx, gpu_count, self.joblib.get("n_jobs"))
        except UserError as err:  # the CLI said it before Hydra started; here for a sweep started another way
            if fresh:
                shutil.rmtree(sweep_dir, ignore_errors=True)
            import sys

            print(f"error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if gpus is None:  # CPU jobs: joblib as it comes
            if self.joblib.get("n_jobs") is None:
                self.joblib["n_jobs"] = CPU_N_JOBS
            return _core.launch(launcher=self, job_overrides=job_overrides, initial_job_idx=initial_job_idx)
        return self._launch_on_gpus(job_overrides, initial_job_idx, gpus, gpu_count, sweep_dir)

    def _launch_on_gpus(self, job_overrides, initial_job_idx: int, gpus: list[int | None], gpu_count: int,
                        sweep_dir: Path) -> list[JobReturn]:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import configure_log, filter_overrides, setup_globals
        from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
        from joblib import Parallel, delayed

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        lanes = lanes_of(gpus, initial_job_idx, self.joblib.get("n_jobs") or gpu_count)
        joblib_cfg = {**self.joblib, "n_jobs": min(self.joblib.get("n_jobs") or gpu_count, len(lanes)),
                      "backend": "loky"}  # loky: the threading backend is incompatible with Hydra (as in _core)
        process_joblib_cfg(joblib_cfg)
        log.info("Joblib.Parallel(%s) is launching %d jobs, one per GPU at a time (%s here)",
                 ",".join(f"{k}={v}" for k, v in joblib_cfg.items()), len(job_overrides), _gpus(gpu_count))
        log.info("Launching jobs, sweep output dir : %s", sweep_dir)
        for k, (overrides, gpu) in enumerate(zip(job_overrides, gpus, strict=True), start=initial_job_idx):
            log.info("\t#%d : %s (%s)", k, " ".join(filter_overrides(overrides)),
                     "cpu" if gpu is None else f"cuda:{gpu}")
        job = {k: (k, list(o), g) for k, (o, g) in enumerate(zip(job_overrides, gpus, strict=True),
                                                              start=initial_job_idx)}
        state = Singleton.get_state()
        done = Parallel(**joblib_cfg)(
            delayed(_run_lane)([job[k] for k in nums], self.hydra_context, self.config, self.task_function, state)
            for nums in lanes.values())
        returns = dict(pair for lane in done for pair in lane)
        return [returns[k] for k in sorted(returns)]
