"""torchrun (DDP) awareness: who am I (RANK / LOCAL_RANK / WORLD_SIZE), which device is mine, and the
few collective steps the runner and a training loop need. Without torchrun every function is the
single-process no-op, so experiments call them unconditionally.

The contract (docs/design.md, "Distributed runs"): all ranks share one run folder (rank 0 picks its name and
broadcasts it); only rank 0 writes files, logs, progress and figures; each rank gets a seed offset;
LOCAL_RANK picks the GPU.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from experiments.core.errors import UserError
from experiments.core.ranks import DistInfo, hydra_overrides_for_rank, info, is_main_process  # noqa: F401 (here too)


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
    """Collect, then destroy the group, while the interpreter is still whole. A DistributedDataParallel
    wrapper left as garbage in a reference cycle still holds the group, so the collection comes first.
    This is the best a library can do at exit; the CLI goes further with `end_rank`. Not after an uncaught
    exception (Python has set sys.last_value by then): the rank may have left an asynchronous collective
    (a DDP bucket's all-reduce) waiting for peers, and destroying the group would wait with it."""
    if dist.is_initialized() and not hasattr(sys, "last_value"):
        gc.collect()
        dist.destroy_process_group()


def end_rank(code: int | str | None) -> None:
    """End this torchrun rank now, with `code`, past interpreter finalization; a no-op without a process
    group. A gloo rank can abort in finalization even after its group is destroyed ("terminate called
    without an active exception", SIGABRT; a gloo worker thread outliving the interpreter, as described
    in pytorch/pytorch#179291): the rank has done its work, but torchrun sees the signal and kills the
    others, rank 0 while it writes figures. Destroying the group at exit, or collecting then destroying it,
    makes the abort rarer but does not end it: it can come after `destroy_process_group` has returned. So
    the CLI, once its command is over, flushes what Python would flush (log handlers, stdout, stderr) and
    leaves with os._exit, before finalization. At the end of the command, not after each run: a torchrun
    sweep runs its jobs in one process group."""
    if not dist.is_initialized():
        return
    if not isinstance(code, int):  # sys.exit(None) is 0; sys.exit("message") prints it and is 1
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    if code == 0:  # a failed rank may have a collective pending (see above): it leaves without destroying
        _destroy_at_exit()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe has nothing left to flush into
            pass
    os._exit(code)


def local_device(device: torch.device) -> torch.device:
    """This rank's device: cuda:LOCAL_RANK under torchrun, the given device otherwise."""
    me = info()
    if device.type == "cuda" and me.distributed:
        if me.local_rank >= torch.cuda.device_count():  # the CLI says it before any rank starts (check_gpu_count)
            raise UserError(_too_few_gpus(torch.cuda.device_count()))
        device = torch.device("cuda", me.local_rank)
        torch.cuda.set_device(device)
    return device


def _local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", info().world_size))


def _too_few_gpus(gpus: int) -> str:
    n = _local_world_size()
    return (f"torchrun --nproc_per_node={n} on a machine with {gpus} GPU{'s' if gpus != 1 else ''}: each rank "
            f"takes cuda:LOCAL_RANK; use --nproc_per_node={max(gpus, 1)}, or device=cpu")


def check_gpu_count(device: str) -> None:
    """Before a torchrun launch does anything: every rank on this node needs a GPU of its own when the run
    is on CUDA (else rank N dies on cuda:N with "invalid device ordinal"). Every rank decides the same;
    rank 0 says it in one line (UserError), the others leave quietly with exit status 2."""
    me = info()
    device = str(device).lower()
    if not me.distributed or device == "cpu" or not torch.cuda.is_available():
        return  # device=cuda without CUDA at all is resolve_device's error
    if not (device == "auto" or device.startswith("cuda")):
        return
    gpus = torch.cuda.device_count()
    if _local_world_size() > gpus:
        if me.is_main:
            raise UserError(_too_few_gpus(gpus))
        raise SystemExit(2)


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


def run_on_worker_rank(exp, cfg, run_dir: Path, run_id: str):
    """What the runner does on ranks other than 0: the same experiment, same config and folder, but a
    context that writes nothing (rank 0 writes run.json, the CSVs and the figures) and seed + rank."""
    from experiments.core import precision
    from experiments.core.results import RunContext
    from experiments.core.runtime import resolve_device, resolve_dtype, seed_everything, set_threads

    class WorkerRunContext(RunContext):
        def flush(self) -> None:  # rank 0 owns the files
            pass

    ctx = WorkerRunContext(run_dir=Path(run_dir), experiment=exp.name, run_id=run_id)
    config = exp.config(cfg)  # the typed config, as rank 0's runner gives it
    ctx.device = local_device(resolve_device(config.device))
    ctx.dtype = resolve_dtype(config.dtype)
    precision.pin(ctx.device, ctx.dtype, **precision.flags(config))  # as rank 0's runner pins it
    set_threads(config)
    seed_everything(config.seed + info().rank)
    exp.run(config, ctx)
    return ctx
