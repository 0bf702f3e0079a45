"""One run, start to finish: run.json says running, the experiment writes its CSVs, the figures
are drawn from those CSVs, run.json says complete. Anything that escapes marks the run failed
(with the error) before it propagates, so a dead run never looks complete."""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.core import distributed, precision, progress, registry
from experiments.core.atomic import write_json_atomic
from experiments.core.errors import first_line
from experiments.core.figures import render_run
from experiments.core.provenance import git_state, host, package_versions
from experiments.core.results import RunContext
from experiments.core.run_folder import RUN_FILE
from experiments.core.runtime import (
    describe_device,
    dtype_name,
    resolve_device,
    resolve_dtype,
    seed_everything,
    set_threads,
    use_device,
)
from experiments.core.summary import claim_line, run_summary

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's time limit, joblib stopping a worker): the run is interrupted, not failed."""


def _submitit_bypass(handler) -> bool:
    """submitit's SIGTERM handler in a SLURM job: it only logs "Bypassing signal SIGTERM" (submitit
    checkpoints on SIGUSR2), so `scancel` would leave the run going until SLURM's SIGKILL."""
    return getattr(handler, "__qualname__", "") == "SignalHandler.bypass" and \
        getattr(handler, "__module__", "").startswith("submitit")


@contextmanager
def _sigterm_interrupts():
    """Turn SIGTERM into Terminated while a run is going, so run.json gets to say `interrupted`.
    Only where nobody else handles SIGTERM, or where submitit's handler would ignore it (scancel)."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or \
            not (previous is signal.SIG_DFL or _submitit_bypass(previous)):
        yield
        return

    def handler(signum, frame):
        raise Terminated("SIGTERM")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_from_hydra(cfg: DictConfig) -> None:
    """Entry point inside Hydra's job: find the experiment and its output folder, then run."""
    hc = HydraConfig.get()
    name = hc.runtime.choices["experiment"]
    run_dir = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN:
        run_id = f"{Path(hc.sweep.dir).name}-{hc.job.num}"
    else:
        run_id = run_dir.name
    overrides = list(hc.overrides.task)
    run(name, cfg, run_dir, run_id, overrides, preset=hc.runtime.choices.get("preset"))


def run(name: str, cfg: DictConfig, run_dir: Path, run_id: str, overrides: list[str],
        preset: str | None = None) -> RunContext:
    exp = registry.get(name)
    if not distributed.is_main_process():  # torchrun: rank 0 alone writes run.json, the CSVs and the figures
        return distributed.run_on_worker_rank(exp, cfg, run_dir, run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    record: dict = {
        "experiment": name,
        "run_id": run_id,
        "status": "running",
        "start": _now(),
        "end": None,
        "wall_time_s": None,
        "git": git_state(),
        "packages": package_versions(),
        "host": host(),
        "device": None,
        "dtype": None,
        "precision": None,
        "seed": cfg.seed,
        "preset": preset,
        "overrides": overrides,
        "torch_threads": torch.get_num_threads(),
    }
    run_json = run_dir / RUN_FILE
    write_json_atomic(run_json, record)
    t0 = time.perf_counter()
    ctx = RunContext(run_dir=run_dir, experiment=name, run_id=run_id)
    progress.reset()
    # Each phase names itself, so that an interrupt or error anywhere before run.json says complete records
    # where it stopped: "setup", a loop's step or "experiment (after grid 100/100)", "results", "figures",
    # "summary".
    try:
        with _sigterm_interrupts():
            progress.phase("setup")
            # The experiment gets its typed config; `cfg`, as composed, stays for what is written about the run
            # (run.json, the log), where a value reads as it was given.
            config = exp.config(cfg)
            asked = (config.device, config.dtype)
            device, dtype = exp.computes_in or asked  # an experiment that computes in one place says so
            ctx.device = use_device(resolve_device(device))  # cuda -> cuda:K, K current
            ctx.dtype = resolve_dtype(dtype)
            if exp.computes_in and asked[0].lower().startswith("cuda") and ctx.device.type != "cuda":
                ctx.notes.append(f"{name} computes in {dtype_name(ctx.dtype)} on the {device} whatever device= "
                                 f"and dtype= say (device={asked[0]} here)")
            set_threads(config)
            record["torch_threads"] = torch.get_num_threads()
            record["device"] = describe_device(ctx.device)
            record["dtype"] = dtype_name(ctx.dtype)
            record["precision"], notes = precision.pin(ctx.device, ctx.dtype, **precision.flags(config))
            ctx.notes.extend(notes)
            write_json_atomic(run_json, record)
            seed_everything(config.seed)
            log.info("%s: %s -> %s", name, exp.figures_label, run_dir)  # "patch_export: checkpoint -> ..."
            log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
            progress.phase("experiment")
            exp.run(config, ctx)
            progress.phase("results")  # metrics.csv, claims.csv
            ctx.flush()
            progress.phase("figures")
            render_run(run_dir, exp)
            progress.phase("summary")  # the claim lines and the summary, then run.json: complete (last)
            _record_precision(record, ctx)
            wall_time_s = round(time.perf_counter() - t0, 3)
            claims = ctx.claims()
            for row in claims.to_dict("records"):
                log.info("%s", claim_line(row))
            for line in run_summary(run_dir, claims, wall_time_s, preset):
                log.info("%s", line)
            for note in ctx.notes:
                log.info("note: %s", note)
            record.update(status="complete", end=_now(), wall_time_s=wall_time_s)
            record["claims_passed"] = int(claims["passed"].sum())
            record["claims_total"] = len(claims)
            if ctx.notes:
                record["notes"] = list(ctx.notes)
            write_json_atomic(run_json, record)
    except BaseException as err:  # Ctrl-C / SIGTERM: interrupted; anything else: failed; never complete
        interrupted = isinstance(err, KeyboardInterrupt)
        try:
            ctx.flush()  # keep what was measured
        finally:
            _record_precision(record, ctx)
            record.update(status="interrupted" if interrupted else "failed", end=_now(),
                          wall_time_s=round(time.perf_counter() - t0, 3),
                          error=first_line(err, typed=True), stopped_at=progress.last_progress())
            write_json_atomic(run_json, record)
        raise
    return ctx


def _record_precision(record: dict, ctx: RunContext) -> None:
    """run.json's `precision`: what the experiment says ran (mixed precision), else what the runner pinned
    (`float32 (IEEE)`, core/precision.py); and `model`, the model and weights the claims were measured on,
    where the experiment says."""
    pinned = record.get("precision") or record.get("dtype")
    said = ctx.precision if ctx.precision != record.get("dtype") else None  # the bare dtype adds nothing
    if said and pinned and pinned.startswith("tf32") and "tf32" not in said:
        record["precision"] = f"{said}, {pinned}"  # autocast's float32 parts ran TF32
    else:
        record["precision"] = said or pinned
    if ctx.model:
        record["model"] = ctx.model

