"""Patched generation vs stock transformers `generate` (KV cache): the real trained Gemma 3 270M and
Qwen2.5-Coder 0.5B, and the real 1B shapes with random weights.

    python benchmarks/patch_bench.py [--model gemma-3-270m|qwen2.5-0.5b|gemma3-1b-random|llama3.2-1b-random]
                                     [--variant closed_loop] [--dtype float32] [--tokens 8]

Targets: gemma-3-270m (issue 20) and qwen2.5-0.5b (issue 32: the same, beside it) patched generation ≤ 1.8×
stock `generate`'s time per token and ≤ 1.2× its peak memory; the 1B shapes (issue 8) ≤ 3× and ≤ 1.5×.
Each mode runs in its own process; the peak RSS (VmHWM) is reset after the model is built, so it is the peak
while generating (model included). Modes, time per token (the prefill not counted):
- generate: stock `model.generate(ids, max_new_tokens=N, do_sample=False)` with its KV cache, timed as
  (t(N + 1) − t(1)) / N, median of 3;
- patched: patched generation (`generate.patched_generate`): the patched model, fed only its own tokens,
  picks every token; the with-context decoder body (KV-cached, no LM head) gives the targets; median;
- compare: the patch_match experiment's step (`generate.compare_generation`, no control): the same plus
  the with-context logits it compares against; median.
Prints a table; not a test.
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


def measure(mode: str, model_name: str, dtype_name: str, tokens: int, variant: str, threads: int) -> dict:
    import gc

    import torch

    if threads:
        torch.set_num_threads(threads)

    from experiments.core.runtime import resolve_dtype
    from experiments.patching.generate import compare_generation, patched_generate
    from experiments.patching.patcher import Patcher
    from experiments.zoo.loading import load_model
    from experiments.zoo.prompts import encode_prompt

    bundle = load_model(model_name, resolve_dtype(dtype_name), "cpu", seed=0)
    inputs = encode_prompt(bundle, PROMPT)
    gc.collect()
    rss_model = peak_rss_mb(reset=True)
    parts: dict = {}
    with torch.no_grad():
        if mode == "generate":
            def timed(n: int) -> float:
                t0 = time.perf_counter()
                bundle.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0)
                return 1000 * (time.perf_counter() - t0)

            timed(1)  # warm-up
            times = [(timed(tokens + 1) - timed(1)) / tokens for _ in range(REPEATS)]
        else:
            patcher = Patcher(bundle.model, variant)
            if mode == "patched":
                steps = list(patched_generate(patcher, inputs, tokens + 1))[1:]  # the first step warmed up
                times, context = [st.ms for st in steps], [st.context_ms for st in steps]
            else:
                steps = list(compare_generation(patcher, inputs, tokens + 1, control=False))[1:]
                times, context = [st.patched_ms for st in steps], [st.baseline_ms for st in steps]
            parts = {"context_ms": median(context), "patch_ms": median([st.patch_ms for st in steps])}
    return {"mode": mode, "ms_per_token": median(times), "mean_ms": sum(times) / len(times), **parts,
            "peak_rss_mb": peak_rss_mb(), "rss_after_load_mb": rss_model, "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-1b-random")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--variant", default="closed_loop")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(measure(a.mode, a.model, a.dtype, a.tokens, a.variant, a.threads)))
        return
    root = Path(__file__).resolve().parents[1]
    rows = []
    for mode in MODES:
        cmd = [sys.executable, __file__, "--mode", mode, "--model", a.model, "--dtype", a.dtype,
               "--variant", a.variant, "--tokens", str(a.tokens), "--threads", str(a.threads)]
        res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    plain = rows[0]
    print(f"{a.model} {a.dtype} {a.variant}, {a.tokens} tokens, {plain['threads']} torch threads")
    print(f"{'mode':<10}{'ms/token (median)':>20}{'mean ms':>10}{'RSS after load MB':>19}{'peak RSS MB':>13}"
          f"{'time ×stock':>13}{'peak ×stock':>13}")
    for r in rows:
        print(f"{r['mode']:<10}{r['ms_per_token']:>20.1f}{r['mean_ms']:>10.1f}{r['rss_after_load_mb']:>19.0f}"
              f"{r['peak_rss_mb']:>13.0f}{r['ms_per_token'] / plain['ms_per_token']:>13.2f}"
              f"{r['peak_rss_mb'] / plain['peak_rss_mb']:>13.2f}")
    for r in rows[1:]:
        print(f"{r['mode']}: with-context step {r['context_ms']:.1f} ms + patches and patched forward "
              f"{r['patch_ms']:.1f} ms (medians)")
    time_x, memory_x = TARGETS.get(a.model, DEFAULT_TARGET)
    print(f"targets: patched time ≤ {time_x}× stock generate, peak memory ≤ {memory_x}×")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
