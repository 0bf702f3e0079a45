"""Test-only (tests/core/test_gpu_sweeps.py): a GPU box, as far as the project's code can tell, in every
Python process a test starts with this folder first on PYTHONPATH. Each interpreter imports sitecustomize
at start-up, so the fakes reach the CLI's process and joblib's loky workers alike. The product never
imports this file.

ICL_EXP_FAKE_GPUS=N (N > 0): torch.cuda says there are N GPUs: is_available, device_count, set_device and
current_device (per process, an ordinal past N refused as CUDA refuses it), get_device_name ("Fake GPU K"),
get_device_properties (80 GiB, compute capability 9.0) and mem_get_info (GPU K has K + 1 GiB free, so a
memory query shows which GPU it asked about). No tensor can go to these GPUs, hence the probe.

ICL_EXP_PROBE=DIR: every experiment's body is a probe that computes nothing and records, in DIR/job-K.json,
where job K ran (the run's device, the current GPU, the free memory the project's memory check reads) and
when, as numbers from an event counter (DIR/state.json, under a file lock), not from a clock: each job
waits, at its start, until ICL_EXP_PROBE_EXPECT jobs have been running at once (so a launcher that runs
fewer at a time is caught, after ICL_EXP_PROBE_GIVE_UP_S, default 300 s), and the counter keeps the most
that ever ran at once.
"""

import os

FAKE_GPUS = int(os.environ.get("ICL_EXP_FAKE_GPUS", "0"))
PROBE = os.environ.get("ICL_EXP_PROBE")


def _fake_cuda(n: int) -> None:
    from types import SimpleNamespace

    import torch

    state = {"current": 0}
    gib = 1 << 30

    def index(device=None) -> int:
        if device is None:
            return state["current"]
        if isinstance(device, int):
            k = device
        else:
            device = torch.device(device)
            assert device.type == "cuda", device
            k = state["current"] if device.index is None else device.index
        if not 0 <= k < n:
            raise RuntimeError(f"CUDA error: invalid device ordinal {k} (fake: {n} GPUs)")
        return k

    def set_device(device) -> None:
        if not isinstance(device, int) and torch.device(device).index is None:  # as torch refuses it
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        state["current"] = index(device)

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: n
    torch.cuda.set_device = set_device
    torch.cuda.current_device = lambda: state["current"]
    torch.cuda.get_device_name = lambda device=None: f"Fake GPU {index(device)}"
    torch.cuda.mem_get_info = lambda device=None: ((index(device) + 1) * gib, 80 * gib)
    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(
        name=f"Fake GPU {index(device)}", total_memory=80 * gib, major=9, minor=0)


def _probe(cfg, ctx) -> None:
    import fcntl
    import json
    import time
    from contextlib import contextmanager
    from pathlib import Path

    import torch
    from hydra.core.hydra_config import HydraConfig

    from experiments.zoo.loading import available_bytes

    folder = Path(PROBE)
    expect = int(os.environ["ICL_EXP_PROBE_EXPECT"])

    @contextmanager
    def counter():
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = folder / "state.json"
            state = json.loads(path.read_text()) if path.exists() else {"event": 0, "running": 0, "most": 0}
            yield state
            path.write_text(json.dumps(state))

    with counter() as c:
        c["event"] += 1
        c["running"] += 1
        c["most"] = max(c["most"], c["running"])
        start = c["event"]
    # Only a launcher that never runs `expect` jobs at once waits this long; the first job to give up says so,
    # and the others stop waiting (the sweep then ends, and the test fails on the counter).
    give_up = time.monotonic() + float(os.environ.get("ICL_EXP_PROBE_GIVE_UP_S", "300"))
    while True:
        with counter() as c:
            if c["most"] >= expect or c.get("gave_up"):
                break
            if time.monotonic() > give_up:
                c["gave_up"] = True
                break
        time.sleep(0.05)
    record = {"job": HydraConfig.get().job.num, "device": str(ctx.device), "pid": os.getpid(), "start": start,
              "free_bytes": available_bytes(ctx.device) if ctx.device.type == "cuda" else None,
              "current_gpu": torch.cuda.current_device() if FAKE_GPUS else None}
    ctx.log("probe", 1.0)
    with counter() as c:
        c["event"] += 1
        c["running"] -= 1
        record["end"] = c["event"]
    (folder / f"job-{record['job']}.json").write_text(json.dumps(record))


def _probe_experiments() -> None:
    import dataclasses

    from experiments.core import registry

    real_get = registry.get

    def get(name):
        return dataclasses.replace(real_get(name), run=_probe, plot=lambda metrics, figures_dir: [])

    registry.get = get


if FAKE_GPUS > 0:
    _fake_cuda(FAKE_GPUS)
if PROBE:
    _probe_experiments()
