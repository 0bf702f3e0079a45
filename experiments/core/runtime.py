"""Device, dtype and seeding: the three shared config keys every experiment reads."""

from __future__ import annotations

import random
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
from omegaconf import OmegaConf

from experiments.core.config_schema import DEVICES, Dtype
from experiments.core.errors import UserError


def resolve_dtype(name) -> torch.dtype:
    """A dtype's name (or the schema's Dtype, which a typed config holds: `cfg.dtype.torch` says the same) as
    the torch dtype; one line for a name that is none. The names and aliases are the schema's Dtype."""
    try:
        return Dtype[str(name).lower()].torch  # by name: the aliases are names
    except KeyError:
        raise UserError(f"dtype={name!r} is not one of {', '.join(Dtype.__members__)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Canonical name: 'float32', 'bfloat16', ... (so `dtype=bf16` and `dtype=bfloat16` tabulate alike)."""
    return str(dtype).removeprefix("torch.")


def resolve_device(name: str) -> torch.device:
    name = str(name).lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device={name} was asked for but CUDA is not available here; use device=cpu")
        try:
            device = torch.device(name)
        except RuntimeError:
            raise UserError(f"device={name!r} is not a device: cuda, or cuda:N for GPU N") from None
        gpus = torch.cuda.device_count()  # counts without initialising CUDA (the CLI checks in its own process)
        if device.index is not None and device.index >= gpus:
            have = "is 1 GPU here (cuda:0)" if gpus == 1 else f"are {gpus} GPUs here (cuda:0 to cuda:{gpus - 1})"
            raise UserError(f"device={name}: there {have}")
        return device
    if name == "cpu":
        return torch.device("cpu")
    raise UserError(f"device={name!r} is not one of {', '.join(DEVICES)}")


# Whether the job the CLI is checking runs on another machine, for its experiment's validate(): that gets the
# job's typed config, which has no Hydra node to say (checking()).
_CHECKING_ELSEWHERE: ContextVar[bool] = ContextVar("checking_elsewhere", default=False)


def set_threads(config) -> None:
    """The run's intra-op CPU threads, Common's `threads` (null: torch's default). Read with getattr: a stand-in
    experiment's config, made by hand in a test, may leave the key out."""
    n = getattr(config, "threads", None)
    if n:
        torch.set_num_threads(n)


def launched_elsewhere(cfg=None) -> bool:
    """The jobs run on other machines (hydra/launcher=slurm): whether this one (a login node) has CUDA says
    nothing about theirs, so checks of this machine's devices wait for the job. `cfg`: a config composed
    with Hydra's own node, as the CLI's checks compose it; none: the job the CLI is checking (checking())."""
    if cfg is None:
        return _CHECKING_ELSEWHERE.get()
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None) or {}
    return str(choices.get("hydra/launcher", "")) == "slurm"


@contextmanager
def checking(cfg):
    """While the CLI checks the job composed as `cfg` (with Hydra's node): launched_elsewhere() answers for it."""
    token = _CHECKING_ELSEWHERE.set(launched_elsewhere(cfg))
    try:
        yield
    finally:
        _CHECKING_ELSEWHERE.reset(token)


# the GPUs a run in this process takes (use_device; a plain run's GPU from the CLI's checks on): a CUDA
# context there is the run's own, so their free memory may be read (zoo/loading.available_bytes)
RUN_GPUS: set[int] = set()


def use_device(device: torch.device) -> torch.device:
    """The run's device with its GPU explicit and current: `cuda` becomes cuda:K, K the current GPU (the one
    hydra/launcher=parallel set for this job, experiments/core/parallel_launcher.py), and cuda:K becomes the
    current GPU, so code that says just `cuda` (a new tensor, a memory query) lands on the run's GPU too, and
    run.json names it. Initialises CUDA: called by the run, never by the CLI's checks."""
    if device.type != "cuda":
        return device
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    RUN_GPUS.add(device.index)
    return device


def describe_device(device: torch.device) -> str:
    """`cpu`, or `cuda:K (its name)`: which GPU the run took."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a CPU generator for explicit sampling.

    CPU runs are bit-reproducible for a given seed (single-threaded kernels are deterministic for
    the ops used here; multi-threaded matmul reductions on CPU are too in practice).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
