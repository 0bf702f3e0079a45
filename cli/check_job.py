"""One job's composed config, checked once before the job begins: the device, threads, a misspelt offline model,
the experiment's own validate(); then, over the jobs, a parallel launcher's GPUs and slow float64 cards. A
sweep's jobs are all checked by the CLI before the first starts (cli/overrides.py); a plain run's job checks
itself, in the job (`check_in_job`, from cli/hydra_app.py)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.core.config_schema import DEVICES
from experiments.core.errors import UserError
from experiments.core.registry import Experiment


def check_device(cfg: DictConfig) -> None:
    """`device=` is a string in the schema (cuda:N is not an Enum member); CUDA asked for on a machine
    without it is said before any run folder. Torch is imported only for a cuda device."""
    device = str(cfg.get("device", "auto")).lower()
    if device not in DEVICES and not device.startswith("cuda:"):
        raise UserError(f"device={cfg.device!r} is not one of {', '.join(DEVICES)}")
    if device.startswith("cuda"):
        from experiments.core.runtime import launched_elsewhere, resolve_device  # torch: 1.5 s

        if not launched_elsewhere(cfg):
            resolve_device(device)


def check_threads(cfg: DictConfig) -> None:
    threads = cfg.get("threads")  # an integer or null: Common types it
    if threads is not None and threads < 1:
        raise UserError(f"threads={threads} must be at least 1 (or null for torch's default)")


def check_model_name(cfg: DictConfig) -> None:
    """`model=tiny-lama`: not a folder here, and so close to an offline model's name that it is a typo,
    not a hub id (which would be tried on the hub, a 3 s probe offline, and fail there)."""
    model = cfg.get("model")
    if not isinstance(model, str) or "/" in model or Path(model).expanduser().exists():
        return
    from experiments.patching.load import RANDOM_OFFLINE_MODELS
    from experiments.zoo.loading import TRAINED_OFFLINE_MODELS

    known = (*TRAINED_OFFLINE_MODELS, *RANDOM_OFFLINE_MODELS)  # the registry's trained ones too (qwen2.5-1.5 -> -1.5b)
    if model in known:
        return
    close = difflib.get_close_matches(model, known, n=1, cutoff=0.8)
    if close:
        raise UserError(f"model={model} is neither an offline model nor a local folder: did you mean "
                        f"model={close[0]}? (offline models: {', '.join(known)}; a hub id is "
                        f"org/name, e.g. meta-llama/Llama-3.2-1B)")


def check_job(exp: Experiment, cfg: DictConfig) -> None:
    """Every check of one job's composed config that its types cannot make, in one place, run once a job:
    by the CLI for each job of a sweep before any starts, or by a plain run's job (`check_in_job`)."""
    check_device(cfg)
    check_threads(cfg)
    check_model_name(cfg)
    if exp.validate is not None:
        from experiments.core import runtime

        with runtime.checking(cfg):  # the typed config has no Hydra node: where the job runs is said beside it
            exp.validate(exp.config(cfg))


def this_process_runs_on(cfg: DictConfig) -> None:
    """A plain run on CUDA runs in this process, on cuda:K or the current GPU: its checks may read that GPU's
    free memory (zoo/loading.available_bytes), since the context this creates is the run's own. Not for a
    sweep (its jobs may run in other processes, on other GPUs) nor under torchrun (each rank takes its
    LOCAL_RANK's GPU later): their checks read the card's total memory, creating no context."""
    device = str(cfg.get("device", "auto")).lower()
    if device == "cpu" or not (device == "auto" or device.startswith("cuda")):
        return
    import torch

    from experiments.core import distributed, runtime

    if runtime.launched_elsewhere(cfg) or distributed.info().distributed or not torch.cuda.is_available():
        return
    try:
        index = torch.device(device).index if device.startswith("cuda:") else torch.cuda.current_device()
    except RuntimeError:  # not a device: _check_device says so
        return
    if index is not None and 0 <= index < torch.cuda.device_count():
        runtime.RUN_GPUS.add(index)


def check_parallel_gpus(configs: list[DictConfig]) -> None:
    """hydra/launcher=parallel runs CUDA jobs one per GPU: an n_jobs it cannot honour, or the launcher under
    torchrun, is said here, before any job starts (experiments/core/parallel_launcher.py plans the same)."""
    if configs and "icl_exp_parallel" in str(OmegaConf.select(configs[0], "hydra.launcher._target_", default="")):
        from experiments.core.parallel_launcher import check_sweep

        check_sweep(configs)


def warn_slow_float64(exp: Experiment, configs: list[DictConfig]) -> None:
    """One warning line per GPU for float64 jobs (dtype=float64, or float64 in dtypes=) on a card that runs
    float64 at a small fraction of its float32 rate: not an error, the run is right, only slow."""
    said: set[int] = set()
    for cfg in configs:
        dtypes = [str(cfg.get("dtype", ""))] + [str(d) for d in (cfg.get("dtypes") or [])]
        device = str(cfg.get("device", "auto")).lower()
        if exp.computes_in or not {"float64", "fp64"} & set(dtypes) or device == "cpu":
            continue
        import torch

        from experiments.core.distributed import is_main_process
        from experiments.core.gpu_rates import float64_slowdown
        from experiments.core.runtime import launched_elsewhere

        if launched_elsewhere(cfg) or not torch.cuda.is_available() or not is_main_process():  # said once
            continue
        index = torch.device(device).index if device.startswith("cuda:") else torch.cuda.current_device()
        slow = float64_slowdown(index) if index not in said else None
        said.add(index)
        if slow:
            ratio, card = slow
            print(f"warning: dtype=float64 on cuda:{index} ({card}): this card computes float64 at 1/{ratio} of "
                  f"its float32 rate, so the float64 work of {exp.name} will take about {ratio}x longer than in "
                  f"float32 (an A100 or H100 runs float64 at 1/2)", file=sys.stderr)


def check_in_job(name: str, cfg: DictConfig) -> None:
    """A plain run's checks, in its job, on the config Hydra composed for it (no second composition): the run
    is in this process, so its GPU's free memory may be read (`this_process_runs_on`), then `check_job` and
    the float64 warning. A UserError here is the CLI's one line; the folder Hydra made goes (cli/launch.py)."""
    from experiments.core import registry

    exp = registry.get(name)
    this_process_runs_on(cfg)
    check_job(exp, cfg)
    warn_slow_float64(exp, [cfg])
