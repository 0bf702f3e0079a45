"""The check's driver: stops in one line without CUDA (unless --fake) or without hydra; unpacks .whl/ onto a
PYTHONPATH under a temp folder; runs the plan's phases under one deadline, then the CPU re-runs of what
failed; writes the summary whatever happened (Ctrl-C and a crash of the driver itself included)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

from benchmarks.gpu_check import plan, summary
from benchmarks.gpu_check.cuda import no_cuda_line
from benchmarks.gpu_check.steps import Deadline, run_lanes, stop_all
from benchmarks.gpu_check.wheels import missing, unpack

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 450  # the steps' share of the 8 minutes: the rest is start-up, the summary and slack
SUMMARY_S = 15
LISTING = ("import json; from experiments.core.registry import experiment_names, paper_package; "
           "from experiments.patching.families import tiny_models; "
           "print(json.dumps([{n: paper_package(n) for n in experiment_names()}, list(tiny_models())]))")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="where summary.md and the JSON files go (default: $OUT, else a temp dir)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds for all the steps (default %(default)s); above it, every timeout grows alike")
    ap.add_argument("--fake", action="store_true", default=os.environ.get("ICL_EXP_GPU_CHECK_FAKE") == "1",
                    help="the same steps on the CPU at the smallest sizes (ICL_EXP_GPU_CHECK_FAKE=1)")
    ap.add_argument("--phases", default="functional,timings",
                    help="which phases run (default %(default)s): `timings` alone gives the GPU's time to the "
                         "benchmarks, once a check's functional phase has passed on the same tree")
    ap.add_argument("--dry", action="store_true", help="each step's command only printed: the plumbing alone")
    ap.add_argument("--keep-work", action="store_true", help="keep the temp folder of runs and unpacked wheels")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.phases.split(",")) - set(plan.PHASES))
    if unknown:
        ap.error(f"--phases: no phase {', '.join(unknown)} (the phases: {', '.join(plan.PHASES)})")
    return args


def child_env(deps: Path, work: Path) -> dict[str, str]:
    """The steps' environment: the unpacked wheels and the repository first on PYTHONPATH, offline, a fresh
    cache, no display; a share of the cores per lane (about six run at once)."""
    path = os.pathsep.join(p for p in (str(deps), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    threads = str(max(1, (os.cpu_count() or 1) // 6))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "ICL_EXP_CACHE": str(work / "cache"), "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": threads}


def listing(python: str, env: dict[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """(every registered experiment -> its paper package, the tiny models), asked of the box's python."""
    out = subprocess.run([python, "-c", LISTING], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"listing the experiments failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    experiments, tiny = json.loads(out.stdout.strip().splitlines()[-1])
    return experiments, tuple(tiny)


def scaled(phase: plan.Phase, factor: float) -> plan.Phase:
    """Every step's timeout and the phase's cap times `factor` (--budget over the default: a slower machine,
    a fake run on a CPU)."""
    return replace(phase, cap_s=phase.cap_s and phase.cap_s * factor,
                   lanes=[[replace(s, timeout_s=s.timeout_s * factor) for s in lane] for lane in phase.lanes])


def longest_lane(phase: plan.Phase) -> float:
    """The seconds of the phase's longest lane, its steps' timeouts added up."""
    return max((sum(s.timeout_s for s in lane) for lane in phase.lanes), default=1.0) or 1.0


def _terminated(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def dry(phase: plan.Phase, python: str) -> plan.Phase:
    echo = [python, "-c", "import sys; print('dry run:', *sys.argv[1:])"]
    return replace(phase, lanes=[[replace(s, argv=[*echo, *s.argv]) for s in lane] for lane in phase.lanes])


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    args = parse(argv)
    # Ctrl-C and a SIGTERM (a batch system's time limit) end the steps and still write the summary; SIGINT
    # is set explicitly because a shell's background job starts with it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    python = sys.executable
    if not args.fake:
        line = no_cuda_line(python)
        if line:
            print(line, file=sys.stderr)
            return 1
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="icl_gpu_check_out_"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="icl_gpu_check_"))
    env = child_env(work / "deps", work)
    carried = unpack(ROOT / ".whl", work / "deps")
    lacking = missing(python, env)
    if lacking:
        print(f"{python} cannot import {', '.join(lacking)} and .whl/ holds {len(carried)} wheels: run "
              "`nox -s gpu_wheels` where a registry is reached and bring .whl/ along", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        return 1
    print(f"GPU check{' (fake: on the CPU)' if args.fake else ''}: {args.budget:.0f} s, results in {out}", flush=True)
    note, results = "", {}
    try:
        experiments, tiny = listing(python, env)
        wanted = args.phases.split(",")
        built = plan.build(python, work, out, experiments, args.fake, tiny)
        phases = [p for p in built if p.name in wanted]
        if len(phases) == 1:  # alone, a phase has the whole budget: no cap, its steps' timeouts grown to fill it
            phases = [scaled(replace(phases[0], cap_s=None), max(1.0, args.budget / longest_lane(phases[0])))]
        else:
            phases = [scaled(p, max(1.0, args.budget / BUDGET_S)) for p in phases]
        deadline = Deadline(args.budget)
        for phase in phases:
            phase = dry(phase, python) if args.dry else phase
            limit = deadline.capped(phase.cap_s) if phase.cap_s else deadline
            results.update((r.name, r.status) for r in run_lanes(phase.lanes, limit, out, env, phase.name))
        again = plan.cpu_reruns(phases, results, python, work)
        again = dry(again, python) if args.dry else again
        results.update((r.name, r.status) for r in run_lanes(again.lanes, deadline, out, env, again.name))
    except BaseException as err:  # Ctrl-C, or the driver's own bug: the summary is still written
        stop_all()
        note = f"The check stopped early: {type(err).__name__}: {err}"
        (out / "driver_error.txt").write_text(traceback.format_exc())
    finally:
        path = summary.write(out, work, time.monotonic() - t0, args.budget, note, args.fake)
        print(f"summary: {path}", flush=True)
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if not note and all(s == "passed" for s in results.values()) else 1
