"""One run, start to finish: run.json says running, the experiment writes its CSVs, the figures
are drawn from those CSVs, run.json says complete. Anything that escapes marks the run failed
(with the error) before it propagates, so a dead run never looks complete."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from experiments.core import registry
from experiments.core.atomic import write_json_atomic
from experiments.core.figures import render_run
from experiments.core.provenance import git_state, host, package_versions
from experiments.core.results import RUN_FILE, RunContext
from experiments.core.runtime import (
    describe_device,
    dtype_name,
    resolve_device,
    resolve_dtype,
    seed_everything,
)

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
        "seed": cfg.get("seed"),
        "preset": preset,
        "overrides": overrides,
        "torch_threads": torch.get_num_threads(),
    }
    run_json = run_dir / RUN_FILE
    write_json_atomic(run_json, record)
    t0 = time.perf_counter()
    ctx = RunContext(run_dir=run_dir, experiment=name, run_id=run_id)
    try:
        ctx.device = resolve_device(cfg.get("device", "auto"))
        ctx.dtype = resolve_dtype(cfg.get("dtype", "float32"))
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg.threads))
        record["torch_threads"] = torch.get_num_threads()
        record["device"] = describe_device(ctx.device)
        record["dtype"] = dtype_name(ctx.dtype)
        write_json_atomic(run_json, record)
        seed_everything(int(cfg.get("seed", 0)))
        log.info("%s (%s) -> %s", name, exp.figures, run_dir)
        log.debug("config:\n%s", OmegaConf.to_yaml(cfg))
        exp.run(cfg, ctx)
        ctx.flush()
        render_run(run_dir, exp)
    except BaseException as err:  # KeyboardInterrupt too: the run is failed, not complete
        try:
            ctx.flush()  # keep what was measured
        finally:
            record.update(status="failed", end=_now(), wall_time_s=round(time.perf_counter() - t0, 3),
                          error=f"{type(err).__name__}: {err}")
            write_json_atomic(run_json, record)
        raise
    record.update(status="complete", end=_now(), wall_time_s=round(time.perf_counter() - t0, 3))
    claims = ctx.claims()
    record["claims_passed"] = int(claims["passed"].sum())
    record["claims_total"] = len(claims)
    write_json_atomic(run_json, record)
    for row in claims.to_dict("records"):
        if "id" in row:
            log.info("claim %-4s %s: measured %.3g %s %.3g", "PASS" if row["passed"] else "FAIL", row["id"],
                     row["measured"], row["comparison"], row["tolerance"])
        else:
            log.info("claim %-4s %s: measured %.4g (tolerance %s)", "PASS" if row["passed"] else "FAIL",
                     row["claim"], row["measured"], row["tolerance"])
    log.info("done in %.1fs: %s", record["wall_time_s"], run_dir)
    return ctx
