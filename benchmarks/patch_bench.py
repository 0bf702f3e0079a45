"""Patched generation vs stock transformers `generate` (KV cache): the real trained Gemma 3 270M and
Qwen2.5-Coder 0.5B, and the real 1B shapes with random weights.

    python benchmarks/patch_bench.py [--model gemma-3-270m|qwen2.5-0.5b|gemma3-1b-random|llama3.2-1b-random]
                                     [--variant closed_loop[,stable,...]] [--dtype float32] [--tokens 8]
                                     [--device cpu|cuda[:K]] [--modes generate,patched,compare] [--json OUT]
                                     [--apply materialized[,action]] [--stock eager[,static,compiled]]
                                     [--compile-mode MODE] [--ops]

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
and/or action (W untouched, c (vᵀz) added to the module's output; the open loop only).
`--stock`: which stock `generate` rows (default eager,compiled): eager (transformers' dynamic KV cache, as
before), static (transformers' own static KV cache, `cache_implementation="static"`, not compiled), compiled
(the static cache and transformers' own compiled decoding step: `compile_config=CompileConfig(mode=...)`,
torch.compile of the forward, `mode="reduce-overhead"` on CUDA, where CUDA graphs apply, the default mode on
the CPU). A static or compiled row is warmed up on both lengths it is timed at (compilation not timed) and its
peak memory starts after the warm-up. Time ratios are taken against the fastest stock row (the table says
which), peak memory against stock eager (a compiled row's process also holds the compiler's state).
Where torch.compile cannot run (no C compiler, no Triton on CUDA), one line says so and the compiled row is
skipped.
`--ops`: instead of timing, count per generated token the PyTorch operations (ATen, views excluded) and the
host reads (`.item()`, `int()`, `bool()`, `.tolist()` of a tensor) of the stock step (eager and static cache)
and of patched generation for each variant and apply, split into the with-context step and the patches with
the patched forward (experiments/core/op_count.py; one process, no timing). Prints a table; not a test.
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
STOCK = ("eager", "static", "compiled")  # the stock `generate` rows (--stock)
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


def gemma3_27b_config():
    """google/gemma-3-27b-it's text model, as its config.json gives the shape (62 layers, d 5376, MLP 21,504, 32
    heads of 128, 16 KV heads; 27B parameters): the largest Gemma 3 shape, for the timings a card can hold."""
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168,
        sliding_window=1024, sliding_window_pattern=6, max_position_embeddings=131072,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=[1, 106],
        bos_token_id=2)


# Shapes built here, on the device, in the run's dtype (no float32 copy on the host: a 27B one would be 108 GB),
# weights as transformers initializes them (N(0, 0.02²) matrices, Gemma's norm scales 1): for timings only.
SHAPES = {"gemma3-27b-shape": gemma3_27b_config}


def build_shape(name: str, config, dtype, device):
    """A causal LM of `config`'s shape built straight on `device` in `dtype`, as a bundle with the byte tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.zoo.bundle import ModelBundle
    from experiments.zoo.loading import check_fits
    from experiments.zoo.tokenizer import byte_tokenizer

    check_fits(name, config, dtype, device)  # one line, before anything is allocated
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return ModelBundle(name, model.eval(), byte_tokenizer(), is_random=True)


def load(model_name: str, dtype_name: str, device: str, threads: int):
    import gc

    import torch

    if threads:
        torch.set_num_threads(threads)
    from experiments.core.runtime import resolve_dtype
    from experiments.patching.load import load_checked
    from experiments.zoo.prompts import encode_prompt

    dev = bench_device(device)
    if model_name in SHAPES:
        bundle = build_shape(model_name, SHAPES[model_name](), resolve_dtype(dtype_name), dev)
    else:
        bundle = load_checked(model_name, resolve_dtype(dtype_name), dev, seed=0)
    inputs = encode_prompt(bundle, PROMPT, device=dev)
    gc.collect()
    return bundle, inputs


def compile_mode(device) -> str:
    """torch.compile's mode for the compiled stock row: CUDA graphs where they apply (CUDA), else the default."""
    import torch

    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def stock_kwargs(stock: str, device, mode: str | None = None) -> dict:
    """`generate`'s arguments for a stock row: transformers' own static cache and, for `compiled`, its own
    compiled decoding step (`CompileConfig`; on the CPU transformers compiles only when told to, through the
    config's `_compile_all_devices`). `static` turns transformers' automatic compilation off (on CUDA a static
    cache alone would compile)."""
    if stock not in STOCK:
        raise ValueError(f"stock={stock!r} is not one of {', '.join(STOCK)}")
    if stock == "eager":
        return {}
    if stock == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    import torch
    from transformers import CompileConfig

    config = CompileConfig(mode=mode or compile_mode(device))
    if torch.device(device).type != "cuda":
        config._compile_all_devices = True  # transformers' switch for compiling on a CPU
    return {"cache_implementation": "static", "compile_config": config}


def compile_unavailable(device) -> str | None:
    """Why torch.compile cannot run on `device` here (no C compiler, no Triton, ...), or None where it can:
    a two-operation function compiled and run once."""
    try:
        import torch

        dev = bench_device(str(device))
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4, device=dev))
        torch._dynamo.reset()
    except Exception as err:  # whatever stops compilation: the reason, on one line
        lines = str(err).strip().splitlines()
        return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
    return None


def measure(mode: str, bundle, inputs, tokens: int, variant: str, meter: Meter, apply: str = "materialized",
            stock: str = "eager", compile_as: str | None = None, graphs: str = "off",
            batch_layers: str = "auto", step_compile: str = "off") -> dict:
    import torch

    from experiments.patching.generate import compare_generation, patched_generate
    from experiments.patching.patcher import Patcher
    from experiments.patching.witness import Witness

    held = meter.reset_peak()
    parts: dict = {}
    with torch.no_grad():
        if mode == "generate":
            extra = stock_kwargs(stock, meter.device, compile_as)

            def timed(n: int) -> float:
                t0 = meter.now()
                bundle.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0, **extra)
                return 1000 * (meter.now() - t0)

            if stock == "eager":
                timed(1)  # warm-up
            else:  # the longer first: transformers keeps the static cache's length at the longest asked for,
                for _ in range(2):  # so both lengths share one cache shape (one compiled graph); twice: the
                    timed(tokens + 1)  # CUDA graphs of reduce-overhead are recorded on a second call
                    timed(1)
                held = meter.reset_peak()  # the peak of generating, not of compiling
            from torch._dynamo.utils import counters

            warm = counters["stats"]["unique_graphs"]
            times = [(timed(tokens + 1) - timed(1)) / tokens for _ in range(REPEATS)]
            if stock == "compiled":  # that it compiled, and not again while timed: dynamo's own counts
                parts = {"graphs": counters["stats"]["unique_graphs"], "graph_breaks":
                         sum(counters["graph_break"].values()), "graphs_while_timed": counters["stats"]["unique_graphs"]
                         - warm}
                torch._dynamo.reset()  # on CUDA the next rows share this process: no compiled step (nor its
                bundle.model.__dict__.pop("_compiled_call", None)  # CUDA graphs' memory) is left to them
        else:  # the per-token timers of generate.py synchronize CUDA themselves
            patcher = Patcher(bundle.model, variant, apply, batch_layers=batch_layers)
            if mode == "patched":
                # the first step warmed up (with graphs, the step was recorded before it)
                steps = list(patched_generate(patcher, inputs, tokens + 1, graphs=graphs, compile=step_compile))[1:]
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
            "apply": None if mode == "generate" else apply, "stock": stock if mode == "generate" else None,
            "cuda_graphs": graphs if mode == "patched" else None,
            "batch_layers": None if mode == "generate" else patcher.batched,
            "step_compile": step_compile if mode == "patched" else None,
            "ms_per_token": median(times),
            "mean_ms": sum(times) / len(times), **parts, "peak_mb": meter.peak_mb(), "after_load_mb": held,
            "threads": torch.get_num_threads(), "device": str(meter.device)}


def cases(mode: str, variants: list[str], applies: list[str], stocks: list[str],
          graphs: list[str] = ("off",)) -> list[tuple[str, str, str, str]]:
    """The (variant, apply, stock, graphs) a mode is measured for: stock `generate` once per stock row, patched
    generation once per graphs setting (the step recorded as a CUDA graph, or not)."""
    if mode == "generate":
        return [(variants[0], applies[0], s, "off") for s in stocks]
    return [(v, a, "eager", g) for v in variants for a in applies for g in (graphs if mode == "patched" else ["off"])]


def graph_modes(args: argparse.Namespace) -> list[str]:
    return getattr(args, "graphs", "off").split(",")


def stocks(args: argparse.Namespace) -> list[str]:
    return getattr(args, "stock", "eager").split(",")


def baseline(rows: list[dict]) -> dict | None:
    """The row every time ratio is taken against: the fastest stock `generate` row that ran."""
    stock = [r for r in rows if r.get("mode") == "generate" and "error" not in r]
    return min(stock, key=lambda r: r["ms_per_token"]) if stock else None


def memory_baseline(rows: list[dict]) -> dict | None:
    """The row every peak-memory ratio is taken against: stock eager `generate` where it ran (a compiled row's
    process also holds the compiler's own state, which is not generation's memory), else the fastest."""
    eager = [r for r in rows if r.get("mode") == "generate" and r.get("stock") == "eager" and "error" not in r]
    return eager[0] if eager else baseline(rows)


def one_process(args: argparse.Namespace, modes: list[str], variants: list[str]) -> list[dict]:
    """Every (mode, variant, apply) on one loaded model, in this process (CUDA), or one mode of one variant
    (the CPU's subprocess per mode)."""
    bundle, inputs = load(args.model, args.dtype, args.device, args.threads)
    meter = Meter(args.device)
    rows = []
    for mode in modes:
        for variant, apply, stock, graphs in cases(mode, variants, args.apply.split(","), stocks(args),
                                                   graph_modes(args)):
            try:
                rows.append(measure(mode, bundle, inputs, args.tokens, variant, meter, apply, stock,
                                    getattr(args, "compile_mode", None), graphs,
                                    getattr(args, "batch_layers", "auto"), getattr(args, "step_compile", "off")))
            except Exception as err:  # one variant that fails (or runs out of memory) leaves the others
                rows.append({"mode": mode, "variant": None if mode == "generate" else variant, "apply": apply,
                             "stock": stock if mode == "generate" else None,
                             "error": f"{type(err).__name__}: {err}"})
            if not getattr(args, "mode", None):  # the one-process run (CUDA): each row kept as it is measured
                measured(args, rows)
    return rows


def measured(args: argparse.Namespace, rows: list[dict]) -> None:
    """The newest row on stderr at once, and every row so far in --json: a run stopped at a time limit (the GPU
    check's steps, a lease running out) keeps what it measured. The 2026-11-28 H200 check lost a whole
    eager row this way when the compiled row's compile outlasted the step."""
    r = rows[-1]
    what = r.get("error") or f"{r['ms_per_token']:.2f} ms/token, peak {r['peak_mb']:.0f} MB"
    print(f"measured: {r['mode']} {label(r)} {r.get('apply') or ''}: {what}", file=sys.stderr, flush=True)
    if getattr(args, "json", None):
        write_json(args, rows)


def write_json(args: argparse.Namespace, rows: list[dict]) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    base = baseline(rows)
    args.json.write_text(json.dumps({"model": args.model, "dtype": args.dtype, "device": args.device,
                                     "tokens": args.tokens, "target": TARGETS.get(args.model, DEFAULT_TARGET),
                                     "stock": base["stock"] if base else None, "rows": rows}, indent=1))


def run_all(args: argparse.Namespace, modes: list[str], variants: list[str]) -> list[dict]:
    if args.device.startswith("cuda"):
        return one_process(args, modes, variants)
    root = Path(__file__).resolve().parents[1]
    rows = []
    for mode in modes:
        for variant, apply, stock, graphs in cases(mode, variants, args.apply.split(","), stocks(args),
                                                   graph_modes(args)):
            cmd = [sys.executable, __file__, "--mode", mode, "--model", args.model, "--dtype", args.dtype,
                   "--variant", variant, "--apply", apply, "--tokens", str(args.tokens),
                   "--threads", str(args.threads), "--stock", stock, "--graphs", graphs,
                   "--batch-layers", getattr(args, "batch_layers", "auto"),
                   "--step-compile", getattr(args, "step_compile", "off")]
            if args.compile_mode:
                cmd += ["--compile-mode", args.compile_mode]
            res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
            rows.extend(json.loads(res.stdout.strip().splitlines()[-1]))
    return rows


def label(r: dict) -> str:
    """A row's variant column: the stock row's kind (eager, static, compiled), else the variant (+ batched where its
    layers' input matrices were patched at once, graphs= where the patched step was recorded as a CUDA graph)."""
    if r.get("mode") == "generate":
        return f"stock {r['stock']}"
    graphs = r.get("cuda_graphs")
    return ((r.get("variant") or "") + (" batched" if r.get("batch_layers") else "")
            + (f" graphs={graphs}" if graphs not in (None, "off") else "")
            + (" compiled" if r.get("step_compile") == "on" else ""))


def print_table(args: argparse.Namespace, rows: list[dict]) -> None:
    base, held = baseline(rows), memory_baseline(rows)
    if base is None:
        print("no stock generate row ran: no ratio")
        base = held = {"ms_per_token": float("nan"), "peak_mb": float("nan"), "stock": None}
    memory = "peak MB (max_memory_allocated)" if args.device.startswith("cuda") else "peak RSS MB"
    threads = next((r["threads"] for r in rows if "threads" in r), None)
    print(f"{args.model} {args.dtype} on {args.device}, {args.tokens} tokens, {threads} torch threads")
    print(f"{'mode':<10}{'variant':<24}{'apply':<14}{'ms/token (median)':>20}{'mean ms':>10}{'after load MB':>15}"
          f"{memory:>32}{'time ×stock':>13}{'peak ×stock':>13}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<10}{label(r):<24}{r.get('apply') or '':<14}  {r['error']}")
            continue
        print(f"{r['mode']:<10}{label(r):<24}{r.get('apply') or '':<14}"
              f"{r['ms_per_token']:>20.1f}{r['mean_ms']:>10.1f}{r['after_load_mb']:>15.0f}{r['peak_mb']:>32.0f}"
              f"{r['ms_per_token'] / base['ms_per_token']:>13.2f}"
              f"{r['peak_mb'] / held['peak_mb']:>13.2f}")
    print(f"time ×stock: against stock {base['stock']} generate, the fastest stock row; peak ×stock: against stock "
          f"{held['stock']}")
    for r in rows:
        if "graphs" in r:
            print(f"stock compiled ({compile_mode(args.device) if args.compile_mode is None else args.compile_mode}): "
                  f"{r['graphs']} graph(s) compiled, {r['graphs_while_timed']} of them while timed, "
                  f"{r['graph_breaks']} graph break(s) (torch._dynamo's counters)")
        if r.get("mode") != "generate" and "error" not in r:
            print(f"{r['mode']} {r['variant']} {r.get('apply')}: with-context step {r['context_ms']:.1f} ms + patches "
                  f"and patched forward {r['patch_ms']:.1f} ms (medians)")
            if "witness_ms" in r:
                ratio = r["witness_ms"] / r["query_forward_ms"]
                print(f"  the witness: {r['witness_ms']:.1f} ms a token, {ratio:.2f}× one forward of the query alone "
                      f"({r['query_forward_ms']:.1f} ms); not in the patched time")
    time_x, memory_x = TARGETS.get(args.model, DEFAULT_TARGET)
    print(f"targets: patched time ≤ {time_x}× stock generate, peak memory ≤ {memory_x}×")


# -- --ops: operations and host reads per token ----------------------------------------------------------
def count_stock(bundle, inputs, tokens: int, stock: str) -> dict:
    """Stock `generate`'s operations and host reads per token, as its time is taken: (count(N + 1) − count(1)) / N,
    after a warm-up. Only what runs eagerly can be counted (`eager`, `static`): a compiled step's operations
    are fused kernels the dispatcher does not see one by one."""
    import torch

    from experiments.core.op_count import count_ops

    extra = stock_kwargs(stock, bundle.model.device)

    def counted(n: int):
        with torch.no_grad(), count_ops() as count:
            bundle.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                  **extra)
        return count

    counted(tokens + 1)  # warm-up (and the static cache's longest length)
    diff = counted(tokens + 1) - counted(1)
    return {"what": "stock", "variant": f"stock {stock}", "apply": None, "ops_per_token": diff.ops / tokens,
            "host_reads_per_token": diff.host_reads / tokens, "by_op": dict(diff.by_op.most_common(12))}


def count_patched(bundle, inputs, tokens: int, variant: str, apply: str, batch_layers: str = "auto",
                  step_compile: str = "off") -> dict:
    """Patched generation's (`generate.patched_generate`) operations and host reads per token, the first token
    (the prefill and the first call's caches) not counted, as it is not timed; split into the with-context step
    (`Patcher.context_step`, counted around each of its calls) and the rest: the patches, the patched forward
    and the argmax read back. `step_compile="on"`: the compiled step's kernels instead (`count_compiled`)."""
    from experiments.core.op_count import count_ops, per_token
    from experiments.patching.generate import patched_generate
    from experiments.patching.patcher import Patcher

    patcher = Patcher(bundle.model, variant, apply, batch_layers=batch_layers)
    if step_compile == "on":
        return count_compiled(patcher, inputs, tokens, variant, apply)
    context, step = [], patcher.context_step

    def counted_context(*args, **kwargs):
        with count_ops() as count:
            out = step(*args, **kwargs)
        context.append(count)
        return out

    patcher.context_step = counted_context
    totals = each_token(patched_generate(patcher, inputs, tokens + 1), tokens + 1, count_ops)
    ops, reads = per_token(totals[1:])
    context_ops, context_reads = per_token(context[1:])
    rest = sum(totals[1:], start=type(totals[0])()) - sum(context[1:], start=type(totals[0])())
    return {"what": "patched", "variant": variant, "apply": apply, "batch_layers": patcher.batched,
            "ops_per_token": ops,
            "host_reads_per_token": reads, "context_ops": context_ops, "context_host_reads": context_reads,
            "patch_by_op": dict(rest.by_op.most_common(12))}


def each_token(tokens_run, n: int, counter) -> list:
    """The counts (`counter`: op_count's count_ops or count_launches) of each of the first `n` tokens of a run."""
    totals = []
    for _ in range(n):
        with counter() as count:
            next(tokens_run)
        totals.append(count)
    return totals


def count_compiled(patcher, inputs, tokens: int, variant: str, apply: str) -> dict:
    """The compiled patched step's kernels and host reads per token (`op_count.count_launches`: inductor's fused
    kernels and the ATen operations its code calls), the first token (the compilation) not counted; one compiled
    region, so no split into the with-context step and the rest."""
    import torch._inductor.config as inductor

    from experiments.core.op_count import count_launches, per_token
    from experiments.patching.generate import patched_generate

    inductor.cpp.enable_kernel_profile = True  # each fused kernel a profiler event (before it is compiled)
    totals = each_token(patched_generate(patcher, inputs, tokens + 1, compile="on"), tokens + 1, count_launches)
    ops, reads = per_token(totals[1:])
    rest = sum(totals[1:], start=type(totals[0])())
    return {"what": "patched", "variant": variant, "apply": apply,
            "batch_layers": patcher.batched, "step_compile": "on", "ops_per_token": ops,
            "host_reads_per_token": reads, "patch_by_op": dict(rest.by_op.most_common(12))}


def count_all(args: argparse.Namespace, variants: list[str]) -> list[dict]:
    """--ops: the stock rows that run eagerly (a compiled one is counted as its static cache's eager step),
    then every (variant, apply) of patched generation; one process, one model."""
    bundle, inputs = load(args.model, args.dtype, args.device, args.threads)
    kinds = list(dict.fromkeys("static" if s == "compiled" else s for s in stocks(args)))
    rows = []
    for kind in kinds:
        rows.append(count_stock(bundle, inputs, args.tokens, kind))
    for variant in variants:
        for apply in args.apply.split(","):
            try:
                rows.append(count_patched(bundle, inputs, args.tokens, variant, apply,
                                          getattr(args, "batch_layers", "auto"), getattr(args, "step_compile", "off")))
            except Exception as err:
                rows.append({"what": "patched", "variant": variant, "apply": apply,
                             "error": f"{type(err).__name__}: {err}"})
    return rows


def print_ops(args: argparse.Namespace, rows: list[dict]) -> None:
    print(f"{args.model} {args.dtype} on {args.device}: per generated token ({args.tokens} tokens, the first not "
          f"counted), PyTorch operations (ATen, views excluded) and host reads (.item(), int(), bool(), .tolist()); "
          "a compiled step's: its fused kernels and the ATen operations its code calls")
    print(f"{'what':<9}{'variant':<24}{'apply':<14}{'ops/token':>11}{'host reads/token':>18}"
          f"{'with-context ops':>18}{'its host reads':>16}{'patches+forward ops':>21}")
    for r in rows:
        if "error" in r:
            print(f"{r['what']:<9}{r['variant']:<24}{r.get('apply') or '':<14}  {r['error']}")
            continue
        name = label(r) if r["what"] == "patched" else r["variant"]
        line = f"{r['what']:<9}{name:<24}{r.get('apply') or '':<14}{r['ops_per_token']:>11.1f}" \
               f"{r['host_reads_per_token']:>18.1f}"
        if "context_ops" in r:
            line += f"{r['context_ops']:>18.1f}{r['context_host_reads']:>16.1f}" \
                    f"{r['ops_per_token'] - r['context_ops']:>21.1f}"
        print(line)


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
    ap.add_argument("--stock", default="eager,compiled",
                    help="the stock generate rows: any of eager,static,compiled (static: transformers' static KV "
                         "cache; compiled: it and the compiled decoding step)")
    ap.add_argument("--compile-mode", help="torch.compile's mode for the compiled row (default: reduce-overhead on "
                                           "CUDA, default on the CPU)")
    ap.add_argument("--graphs", default="off",
                    help="patched mode: the whole patched token recorded as a CUDA graph and replayed, any of "
                         "off,on,auto (each a row; on: CUDA only, refused elsewhere in one line)")
    ap.add_argument("--batch-layers", default="auto",
                    help="auto, on, inputs or off: an open loop's input matrices patched in all layers by one call "
                         "over stacked weights (inputs), and its alone passes of alike layers as one vmap too (on; "
                         "auto: on, on a GPU; the closed loop is never batched)")
    ap.add_argument("--step-compile", default="off",
                    help="auto, on or off: the whole patched token compiled by torch.compile (patched mode; on: "
                         "refused in one line without Triton or a C compiler; auto compiles nowhere yet, see "
                         "step_graph.py)")
    ap.add_argument("--ops", action="store_true",
                    help="count operations and host reads per token instead of timing (no ratios)")
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
    kinds = a.stock.split(",")
    if not kinds or not set(kinds) <= set(STOCK) or len(set(kinds)) != len(kinds):
        sys.exit(f"--stock: one or more of {', '.join(STOCK)}, each once (got {a.stock})")
    import torch

    from experiments.core.errors import UserError
    from experiments.patching.layer_stack import BATCH_LAYERS
    from experiments.patching.step_graph import GRAPHS, use_compile

    modes_g = a.graphs.split(",")
    if not set(modes_g) <= set(GRAPHS) or len(set(modes_g)) != len(modes_g):
        sys.exit(f"--graphs: one or more of {', '.join(GRAPHS)}, each once (got {a.graphs})")
    if "on" in modes_g and not a.device.startswith("cuda"):
        sys.exit(f"--graphs on: CUDA graphs need a CUDA device (--device {a.device}); off or auto here")
    if a.batch_layers not in BATCH_LAYERS:
        sys.exit(f"--batch-layers: one of {', '.join(BATCH_LAYERS)} (got {a.batch_layers})")
    try:  # before the model is loaded: the one line patched generation would give
        use_compile(a.step_compile, torch.device("cuda" if a.device.startswith("cuda") else "cpu"))
    except UserError as err:
        sys.exit(f"--step-compile: {err}")
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("--device cuda: no CUDA device (torch.cuda.is_available() is False)")
    if a.model in SHAPES:  # a shape built here: refused in one line where it cannot fit, before anything starts
        from experiments.core.runtime import resolve_dtype
        from experiments.zoo.loading import check_fits

        try:
            check_fits(a.model, SHAPES[a.model](), resolve_dtype(a.dtype), a.device)
        except UserError as err:
            sys.exit(str(err))
    if a.ops:
        rows = count_all(a, variants)
        print_ops(a, rows)
    else:
        if "compiled" in kinds:
            why = compile_unavailable(a.device)
            if why is not None:
                print(f"stock compiled: skipped, torch.compile cannot run on {a.device} here ({why})")
                kinds.remove("compiled")
                if not kinds:
                    sys.exit("--stock: nothing left to time")
                a.stock = ",".join(kinds)
        rows = run_all(a, modes, variants)
        print_table(a, rows)
    if a.json:
        write_json(a, rows)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
