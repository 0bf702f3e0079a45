"""torchrun (DDP) awareness: who am I (RANK / LOCAL_RANK / WORLD_SIZE), which device is mine, and the
few collective steps the runner and a training loop need. Without torchrun every function is the
single-process no-op, so experiments call them unconditionally.

The contract (DESIGN.md, distributed runs): all ranks share one run folder (rank 0 picks its name and
broadcasts it); only rank 0 writes files, logs, progress and figures; each rank gets a seed offset;
LOCAL_RANK picks the GPU.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def info() -> DistInfo:
    env = os.environ
    return DistInfo(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


def is_main_process() -> bool:
    return info().is_main


def init() -> DistInfo:
    """Join the process group once (env:// rendezvous set up by torchrun); gloo for CPU tensors, NCCL for CUDA.
    The group is destroyed at exit, while the interpreter is still whole (`_destroy_at_exit`)."""
    me = info()
    if me.distributed and not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(_destroy_at_exit)
    return me


def _destroy_at_exit() -> None:
    """A process that exits with its gloo group alive can abort during interpreter finalization ("terminate
    called without an active exception", SIGABRT; pytorch/pytorch#190489): the rank dies after its work is
    done, and torchrun then kills the others, rank 0 while it writes the figures. Destroying the group is
    not enough while a DistributedDataParallel wrapper, garbage in a reference cycle, still holds it: the
    collection comes first. Measured on this 2-core machine, 4 gloo ranks with DDP and an all_gather, 10
    launches each: nothing at exit 5 aborted, destroy alone 4, collect then destroy 0 (0 of 30 without
    the all_gather). At exit, not after each run: a torchrun sweep runs its jobs in one process group."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def local_device(device: torch.device) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK under torchrun, the given device otherwise."""
    me = info()
    if device.type == "cuda" and me.distributed:
        device = torch.device("cuda", me.local_rank)
        torch.cuda.set_device(device)
    return device


def agree(value):
    """Rank 0's value on every rank (e.g. the run folder name); the value itself without torchrun."""
    me = init()
    if not me.distributed:
        return value
    box = [value if me.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def agree_across_ranks(value):
    """`agree` when torchrun started several processes; the value itself otherwise (no process group)."""
    return agree(value) if info().distributed else value


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def mean_over_ranks(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def wait_for(path: Path, poll_s: float = 2.0) -> None:
    """Block until rank 0 has written `path` (data preparation can outlast a collective's timeout, so
    the other ranks poll the file system instead of sitting in a barrier)."""
    while not Path(path).exists():
        time.sleep(poll_s)


def hydra_overrides_for_rank() -> list[str]:
    """Ranks other than 0 write no .hydra/ folder and no log file into the shared run folder."""
    if info().is_main:
        return []
    # The console handler stays (conf/config.yaml gives it the project's formatter, which a disabled
    # job_logging would leave without a class); the log-file handler is kept off the root logger and
    # opens its file lazily, so it never touches the shared folder.
    return ["hydra.output_subdir=null", "hydra.job_logging.root.handlers=[console]",
            "++hydra.job_logging.handlers.file.delay=true", "hydra/hydra_logging=disabled"]


def run_on_worker_rank(exp, cfg, run_dir: Path, run_id: str):
    """What the runner does on ranks other than 0: the same experiment, same config and folder, but a
    context that writes nothing (rank 0 writes run.json, the CSVs and the figures) and seed + rank."""
    from experiments.core.results import RunContext
    from experiments.core.runtime import resolve_device, resolve_dtype, seed_everything

    class WorkerRunContext(RunContext):
        def flush(self) -> None:  # rank 0 owns the files
            pass

    ctx = WorkerRunContext(run_dir=Path(run_dir), experiment=exp.name, run_id=run_id)
    ctx.device = local_device(resolve_device(cfg.get("device", "auto")))
    ctx.dtype = resolve_dtype(cfg.get("dtype", "float32"))
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    seed_everything(int(cfg.get("seed", 0)) + info().rank)
    exp.run(cfg, ctx)
    return ctx
