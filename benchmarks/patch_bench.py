"""Patched generation vs stock transformers `generate` (KV cache): the real trained Gemma 3 270M and
Qwen2.5-Coder 0.5B, and the real 1B shapes with random weights.

    python benchmarks/patch_bench.py [--model gemma-3-270m|qwen2.5-0.5b|gemma3-1b-random|llama3.2-1b-random]
                                     [--variant closed_loop[,stable,...]] [--dtype float32] [--tokens 8]
                                     [--device cpu|cuda[:K]] [--modes generate,patched,compare] [--json OUT]
                                     [--apply materialized[,action]]

Targets: gemma-3-270m and qwen2.5-0.5b (the same, beside it) patched generation ≤ 1.8× stock `generate`'s
time per token and ≤ 1.2× its peak memory; the 1B shapes ≤ 3× and ≤ 1.5×.
On the CPU each mode runs in its own process; the peak RSS (VmHWM) is reset after the model is built, so it
is the peak while generating (model included). On CUDA (`--device cuda`) the modes share one process and
one model: the clock is read after `torch.cuda.synchronize`, and the peak memory is
`torch.cuda.max_memory_allocated`, reset before each mode (model included; the allocator's cache and the
CUDA context are not counted). Modes, time per token (the prefill not counted):
- generate: stock `model.generate(ids, max_new_tokens=N, do_sample=False)` with its KV cache, timed as
  (t(N + 1) − t(1)) / N, median of 3;
- patched: patched generation (`generate.patched_generate`): the patched model, fed only its own tokens,
  picks every token; the with-context decoder body (KV-cached, no LM head) gives the targets; median;
- compare: the patch_match experiment's step (`generate.compare_generation`, no control): the same plus
  the with-context logits it compares against; median. For an open loop also the witness's forward of the
  patched tensors (`witness_ms`, outside the patched time) beside one forward of the query alone
  (`query_forward_ms`): the witness may cost one such forward a token (patching/witness.py).
`--apply`: how a matrix's rank-1 patch reaches the forward (patcher.py): materialized (W + ΔW rounded, written)
and/or action (W untouched, c (vᵀz) added to the module's output; the open loop only). Prints a table; not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

MODES = ("generate", "patched", "compare")
# model -> (time ×stock, peak memory ×stock); others: DEFAULT_TARGET
TARGETS = {"gemma-3-270m": (1.8, 1.2), "qwen2.5-0.5b": (1.8, 1.2)}
DEFAULT_TARGET = (3.0, 1.5)
REPEATS = 3  # stock generate is timed this many times (median): one timing varied by ±10 % here
PROMPT = "Write a single-sentence weather forecast for Mars, from the perspective of a slightly annoyed robot."


def peak_rss_mb(reset: bool = False) -> float:
    """VmHWM of this process (Linux); `reset` restarts it from the current RSS (clear_refs 5), so that
    the peak of generation is not the peak of building the model."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


class Meter:
    """The clock and the peak memory of one device: on CUDA the clock waits for the queued kernels and the
    peak is the caching allocator's (MB); on the CPU the peak is the process's RSS."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def reset_peak(self) -> float:
        """Start the peak from what is held now (the model); returns that, MB."""
        if not self.cuda:
            return peak_rss_mb(reset=True)
        import gc

        import torch

        gc.collect()  # the previous variant's patcher and steps: not this one's memory
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device) / 2**20

    def peak_mb(self) -> float:
        if not self.cuda:
            return peak_rss_mb()
        import torch

        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) / 2**20


def bench_device(name: str):
    """`cuda` made cuda:K (the current GPU) and current, as a run does: torch.cuda.set_device refuses a device
    without an index (the first GPU check on an H200 failed here)."""
    import torch

    from experiments.core.runtime import use_device

    return use_device(torch.device(name))


def load(model_name: str, dtype_name: str, device: str, threads: int):
    import gc

    import torch

    if threads:
        torch.set_num_threads(threads)
    from experiments.core.runtime import resolve_dtype
    from experiments.patching.load import load_checked
    from experiments.zoo.prompts import encode_prompt

    dev = bench_device(device)
    bundle = load_checked(model_name, resolve_dtype(dtype_name), dev, seed=0)
    inputs = encode_prompt(bundle, PROMPT, device=dev)
    gc.collect()
    return bundle, inputs


def measure(mode: str, bundle, inputs, tokens: int, variant: str, meter: Meter, apply: str = "materialized") -> dict:
    import torch

    from experiments.patching.generate import compare_generation, patched_generate
    from experiments.patching.patcher import Patcher
    from experiments.patching.witness import Witness

    held = meter.reset_peak()
    parts: dict = {}
    with torch.no_grad():
        if mode == "generate":
            def timed(n: int) -> float:
                t0 = meter.now()
                bundle.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0)
                return 1000 * (meter.now() - t0)

            timed(1)  # warm-up
            times = [(timed(tokens + 1) - timed(1)) / tokens for _ in range(REPEATS)]
        else:  # the per-token timers of generate.py synchronize CUDA themselves
            patcher = Patcher(bundle.model, variant, apply)
            if mode == "patched":
                steps = list(patched_generate(patcher, inputs, tokens + 1))[1:]  # the first step warmed up
                times, context = [st.ms for st in steps], [st.context_ms for st in steps]
            else:  # as patch_match runs it: an open loop's patched tensors also through the witness
                witness = Witness(bundle.model, patcher.adapter.layers, patcher.logit_dtype)
                steps = list(compare_generation(patcher, inputs, tokens + 1, control=False, witness=witness))[1:]
                times, context = [st.patched_ms for st in steps], [st.baseline_ms for st in steps]
            parts = {"context_ms": median(context), "patch_ms": median([st.patch_ms for st in steps])}
            if mode == "compare" and patcher.variant.evidence:  # the witness against one query forward
                query = inputs["input_ids"][:, -1:]
                patcher.control_logits(query)
                forwards = []
                for _ in range(REPEATS):
                    t0 = meter.now()
                    patcher.control_logits(query)
                    forwards.append(1000 * (meter.now() - t0))
                parts.update(witness_ms=median([st.witness_ms for st in steps]), query_forward_ms=median(forwards))
    return {"mode": mode, "variant": None if mode == "generate" else variant,
            "apply": None if mode == "generate" else apply, "ms_per_token": median(times),
            "mean_ms": sum(times) / len(times), **parts, "peak_mb": meter.peak_mb(), "after_load_mb": held,
            "threads": torch.get_num_threads(), "device": str(meter.device)}


def cases(mode: str, variants: list[str], applies: list[str]) -> list[tuple[str, str]]:
    """The (variant, apply) pairs a mode is measured for: stock `generate` once."""
    return [(variants[0], applies[0])] if mode == "generate" else [(v, a) for v in variants for a in applies]


def one_process(args: argparse.Namespace, modes: list[str], variants: list[str]) -> list[dict]:
    """Every (mode, variant, apply) on one loaded model, in this process (CUDA), or one mode of one variant
    (the CPU's subprocess per mode)."""
    bundle, inputs = load(args.model, args.dtype, args.device, args.threads)
    meter = Meter(args.device)
    rows = []
    for mode in modes:
        for variant, apply in cases(mode, variants, args.apply.split(",")):
            try:
                rows.append(measure(mode, bundle, inputs, args.tokens, variant, meter, apply))
            except Exception as err:  # one variant that fails (or runs out of memory) leaves the others
                rows.append({"mode": mode, "variant": variant, "apply": apply,
                             "error": f"{type(err).__name__}: {err}"})
    return rows


def run_all(args: argparse.Namespace, modes: list[str], variants: list[str]) -> list[dict]:
    if args.device.startswith("cuda"):
        return one_process(args, modes, variants)
    root = Path(__file__).resolve().parents[1]
    rows = []
    for mode in modes:
        for variant, apply in cases(mode, variants, args.apply.split(",")):
            cmd = [sys.executable, __file__, "--mode", mode, "--model", args.model, "--dtype", args.dtype,
                   "--variant", variant, "--apply", apply, "--tokens", str(args.tokens),
                   "--threads", str(args.threads)]
            res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
            rows.extend(json.loads(res.stdout.strip().splitlines()[-1]))
    return rows


def print_table(args: argparse.Namespace, rows: list[dict]) -> None:
    plain = rows[0]
    memory = "peak MB (max_memory_allocated)" if args.device.startswith("cuda") else "peak RSS MB"
    print(f"{args.model} {args.dtype} on {args.device}, {args.tokens} tokens, {plain.get('threads')} torch threads")
    print(f"{'mode':<10}{'variant':<20}{'apply':<14}{'ms/token (median)':>20}{'mean ms':>10}{'after load MB':>15}"
          f"{memory:>32}{'time ×stock':>13}{'peak ×stock':>13}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<10}{r['variant'] or '':<20}{r.get('apply') or '':<14}  {r['error']}")
            continue
        print(f"{r['mode']:<10}{r['variant'] or '':<20}{r.get('apply') or '':<14}"
              f"{r['ms_per_token']:>20.1f}{r['mean_ms']:>10.1f}{r['after_load_mb']:>15.0f}{r['peak_mb']:>32.0f}"
              f"{r['ms_per_token'] / plain['ms_per_token']:>13.2f}"
              f"{r['peak_mb'] / plain['peak_mb']:>13.2f}")
    for r in rows[1:]:
        if "error" not in r:
            print(f"{r['mode']} {r['variant']} {r.get('apply')}: with-context step {r['context_ms']:.1f} ms + patches "
                  f"and patched forward {r['patch_ms']:.1f} ms (medians)")
            if "witness_ms" in r:
                ratio = r["witness_ms"] / r["query_forward_ms"]
                print(f"  the witness: {r['witness_ms']:.1f} ms a token, {ratio:.2f}× one forward of the query alone "
                      f"({r['query_forward_ms']:.1f} ms); not in the patched time")
    time_x, memory_x = TARGETS.get(args.model, DEFAULT_TARGET)
    print(f"targets: patched time ≤ {time_x}× stock generate, peak memory ≤ {memory_x}×")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-1b-random")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--variant", default="closed_loop", help="one variant, several (naive,stable,...), or all")
    ap.add_argument("--apply", default="materialized", help="materialized, action, or both (materialized,action)")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:K (synchronized timings, GPU memory)")
    ap.add_argument("--modes", default=",".join(MODES), help="which of generate,patched,compare")
    ap.add_argument("--json", type=Path, help="also write the rows here (JSON)")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    variants = a.variant.split(",")
    if variants == ["all"]:
        from experiments.patching.variants import VARIANTS

        variants = list(VARIANTS)
    if a.mode:  # one CPU mode in its own process (its own RSS)
        print(json.dumps(one_process(a, [a.mode], variants)))
        return
    modes = a.modes.split(",")
    if modes[0] != "generate" or not set(modes) <= set(MODES):
        sys.exit(f"--modes: generate first, then any of {', '.join(MODES[1:])} (got {a.modes})")
    if a.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device (torch.cuda.is_available() is False)")
    rows = run_all(a, modes, variants)
    print_table(a, rows)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"model": a.model, "dtype": a.dtype, "device": a.device, "tokens": a.tokens,
                                      "target": TARGETS.get(a.model, DEFAULT_TARGET), "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
