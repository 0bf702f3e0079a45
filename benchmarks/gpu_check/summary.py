"""summary.md and summary.json from what the steps left in OUT (steps/, probe.json, bench/) and in the work
folder's run folders; the small files of each run (run.json, claims.csv, metrics.csv under 1 MB) are
copied to OUT/runs/ so they come back with it. Reads only: whatever failed, it writes what there is."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from benchmarks.gpu_peaks import describe, peak_bf16
from benchmarks.patch_bench import label

SMALL = 1_000_000  # bytes: a run file larger than this stays behind
TAIL = 15  # lines of a failed step's log in the summary


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def steps(out: Path) -> list[dict]:
    return sorted((load(p) for p in (out / "steps").glob("*.json")), key=lambda r: r.get("name", ""))


def runs(work: Path, out: Path) -> list[dict]:
    """Every run folder under `work`: its run.json's essentials and its claims, its small files copied."""
    found = []
    for rj in sorted(work.rglob("run.json")):
        folder, rel = rj.parent, rj.parent.relative_to(work)
        info = load(rj)
        claims = []
        if (folder / "claims.csv").exists():
            with open(folder / "claims.csv", newline="") as f:
                claims = [{k: c.get(k) for k in ("id", "measured", "comparison", "tolerance", "passed")}
                          for c in csv.DictReader(f)]
        found.append({"run": str(rel), **{k: info.get(k) for k in ("experiment", "status", "device", "precision",
                                                                    "wall_time_s", "claims_passed", "claims_total",
                                                                    "error")}, "claims": claims})
        keep = out / "runs" / rel
        keep.mkdir(parents=True, exist_ok=True)
        for f in (*folder.glob("*.json"), *folder.glob("*.csv"), *folder.glob("*.txt")):
            if f.stat().st_size < SMALL:
                shutil.copy2(f, keep / f.name)
    return found


def throughput(work: Path, gpu: str | None) -> dict:
    """gpt_wq under torchrun: the last window's tokens/s and its MFU against the card's dense bf16 peak."""
    folder = work / "runs" / "gpt_wq_torchrun"
    metrics = folder / "metrics.csv"
    if not metrics.exists():
        return {}
    values: dict[str, list[float]] = {}
    with open(metrics, newline="") as f:
        for row in csv.DictReader(f):
            values.setdefault(row["metric"], []).append(float(row["value"]))
    if "tokens_per_s" not in values:
        return {}
    result = {"tokens_per_s": values["tokens_per_s"][-1], "params_total": values.get("params_total", [None])[0]}
    shape = _model_shape(folder / ".hydra" / "config.yaml")
    peak = peak_bf16(gpu) if gpu else None
    result["peak"] = describe(gpu) if gpu else "no GPU: no MFU"
    if peak and shape and result["params_total"]:
        # PaLM's 6N + 12·L·d·T training FLOPs per token (experiments/karbevski/gpt/model.flops_per_token)
        per_token = 6 * result["params_total"] + 12 * shape["n_layer"] * shape["d_model"] * shape["block_size"]
        result["mfu"] = result["tokens_per_s"] * per_token / peak[0]
    return result


def _model_shape(config: Path) -> dict | None:
    try:
        import yaml

        model = yaml.safe_load(config.read_text())["model"]
        return {k: int(model[k]) for k in ("n_layer", "d_model", "block_size")}
    except Exception:
        return None


def write(out: Path, work: Path, wall_s: float, budget_s: float, note: str = "", fake: bool = False) -> Path:
    probe = load(out / "probe.json")
    done = steps(out)
    found = runs(work, out)
    bench = {p.stem: load(p) for p in sorted((out / "bench").glob("*.json"))}
    speed = throughput(work, probe.get("gpu"))
    (out / "summary.json").write_text(json.dumps({"wall_s": round(wall_s, 1), "budget_s": budget_s, "fake": fake,
                                                  "note": note,
                                                  "steps": done, "runs": found, "bench": bench,
                                                  "gpt_wq_throughput": speed}, indent=1) + "\n")
    lines = [f"# icl-exp GPU check: {probe.get('gpu', 'no GPU')}", ""]
    if fake:
        lines += ["A fake check: every step on the CPU at the smallest sizes (the check's plumbing, not a GPU).", ""]
    if note:
        lines += [note, ""]
    lines += [f"{wall_s:.0f} s of {budget_s:.0f} s. python {probe.get('python')}, torch {probe.get('torch')} "
              f"(CUDA {probe.get('cuda_build')}, cuDNN {probe.get('cudnn')}), transformers "
              f"{probe.get('transformers')}, hydra {probe.get('hydra')}, triton {probe.get('triton')}", ""]
    lines += ["## Steps", "", "| step | status | s | what |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.get('name')} | {r.get('status')} | {r.get('seconds', 0):.0f} | {r.get('what')} |" for r in done]
    lines += ["", *verdicts(done), "## Runs", ""]
    for r in found:
        lines.append(f"- {r['run']}: {r['status']}, {r['device']}, {r['precision']}, {r['wall_time_s']} s, claims "
                     f"{r['claims_passed']}/{r['claims_total']}" + (f"; error: {r['error']}" if r["error"] else ""))
        # rnn_context's claims (the ones TF32 moves) in full; a smoke run's failed claims stay in runs/ (smoke
        # trains a few steps: its learning claims are expected to fail); the other runs' failed claims here
        every = "rnn_context" in r["run"]
        failed = not r["run"].startswith("smoke")
        lines += [f"    - {'ok' if c['passed'] == 'True' else 'FAIL'} {c['id']}: {c['measured']} {c['comparison']} "
                  f"{c['tolerance']}" for c in r["claims"] if every or (failed and c["passed"] != "True")]
    lines += ["", "## Patched vs stock generation (benchmarks/patch_bench.py)", ""]
    for name, b in bench.items():
        lines += bench_table(name, b)
    lines += ["## gpt_wq throughput (torchrun, one rank)", ""]
    if speed:
        mfu = f", MFU {100 * speed['mfu']:.1f} %" if "mfu" in speed else ""
        lines += [f"{speed['tokens_per_s']:,.0f} tokens/s (the last logged window){mfu}; {speed['peak']}", ""]
    else:
        lines += ["no tokens/s: the run did not log any", ""]
    lines += ["## Precision probe", "", f"flags: {probe.get('precision_flags')}", "",
              f"relative error vs float64: {probe.get('rel_error_vs_float64')}", "",
              f"matmul TFLOP/s: {probe.get('matmul_tflops')}", ""]
    lines += failed_logs(out, done)
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def verdicts(done: list[dict]) -> list[str]:
    """A failed step beside its CPU re-run: a CUDA problem where the CPU passes, else one of both."""
    by_name = {r["name"]: r for r in done}
    lines = []
    for r in done:
        if r["status"] in ("failed", "timed_out") and not r["name"].endswith(".cpu"):
            cpu = by_name.get(f"{r['name']}.cpu")
            verdict = ("not re-run on the CPU" if cpu is None else
                       "passes on the CPU: a CUDA problem" if cpu["status"] == "passed" else
                       f"{cpu['status']} on the CPU as well: a version gap or a bug of both")
            lines.append(f"- **{r['name']}** {r['status']}: {verdict}")
    return [*lines, ""] if lines else []


def bench_table(name: str, b: dict) -> list[str]:
    rows = b.get("rows") or []
    timed = [r for r in rows if r.get("mode") == "generate" and "error" not in r]
    if not timed:
        return [f"{name}: no stock timing", ""]
    stock = min(timed, key=lambda r: r["ms_per_token"])  # ratios against the fastest stock row (patch_bench's)
    target = b.get("target") or [None, None]
    lines = [f"**{b.get('model')} {b.get('dtype')} on {b.get('device')}**, {b.get('tokens')} tokens; target ≤ "
             f"{target[0]}× time, ≤ {target[1]}× peak memory", "",
             "| mode | variant | ms/token | time ×stock | peak MB | peak ×stock |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r.get('variant')} | {r['error']} | | | |")
        else:
            variant = label(r)  # patch_bench's own: stock kind, or variant + batched / graphs= / compiled
            lines.append(f"| {r['mode']} | {variant} | {r['ms_per_token']:.1f} | "
                         f"{r['ms_per_token'] / stock['ms_per_token']:.2f} | {r['peak_mb']:.0f} | "
                         f"{r['peak_mb'] / stock['peak_mb']:.2f} |")
    return [*lines, ""]


def failed_logs(out: Path, done: list[dict]) -> list[str]:
    lines = []
    for r in done:
        if r.get("status") in ("failed", "timed_out"):
            try:
                tail = (out / r["log"]).read_text(errors="replace").strip().splitlines()[-TAIL:]
            except OSError:
                tail = ["(no log)"]
            lines += [f"## {r['name']}: the end of its log", "", "```", *tail, "```", ""]
    return lines
