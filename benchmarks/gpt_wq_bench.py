"""Training throughput of the five gpt_wq variants (Karbevski & Mijoski Table 2).

    python benchmarks/gpt_wq_bench.py                 # CPU: L=4, d=128, T=128, GPT-2 vocabulary
    python benchmarks/gpt_wq_bench.py --vocab 320     # CPU: the cpu preset's byte-level shape
    python benchmarks/gpt_wq_bench.py --paper         # GPT-2 124M shape on this device (CUDA: bf16, compile)
    python benchmarks/gpt_wq_bench.py --paper --variants baseline_124m --steps 2 --warmup 1   # a CPU try

One optimizer step = forward + backward + clip + AdamW on random token windows, timed after warm-up steps;
tokens/s is the median over the timed steps, best of --rounds rounds. --paper is the paper's shape (12 layers,
12 heads, d 768, T 1024, GPT-2's 50 257 tokens padded to 50 304) on whatever device runs it: on CUDA bf16
autocast, torch.compile and --batch auto (the largest micro-batch the card's free memory holds, estimated
from the shape: gpt/memory.py); on the CPU float32, eager, one sequence, two timed steps. MFU = tokens/s ×
model FLOPs per token (PaLM's 6N + 12·L·d·T, as nanoGPT's estimate_mfu) / the device's dense peak for the
dtype: the GPU's bf16 peak from its name (benchmarks/gpu_peaks.py: H100 SXM, PCIe and NVL apart; an unknown
card or a MIG slice is named and gets no MFU); no float32 peaks and no CPU peak are known here, so those
print "peak unknown". Target: W_Q = I (117M) must not be slower than the 124M baseline (it has less work:
no query projection). Prints a table; not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.gpu_peaks import describe, peak_bf16  # noqa: E402
from experiments.karbevski.gpt.memory import fit_micro_batch  # noqa: E402
from experiments.karbevski.gpt.model import GPT, GPTConfig, flops_per_token  # noqa: E402
from experiments.karbevski.gpt.params import count_meta  # noqa: E402
from experiments.karbevski.gpt.train import TrainSettings, autocast, make_optimizer  # noqa: E402
from experiments.karbevski.gpt.variants import VARIANTS, model_config  # noqa: E402


def peak_flops(device: torch.device, bf16: bool) -> float | None:
    """Dense peak FLOP/s for the run's dtype: a GPU's bf16 peak when known; None otherwise."""
    if device.type != "cuda" or not bf16:
        return None
    found = peak_bf16(torch.cuda.get_device_name(device))
    return found[0] if found else None


def peak_line(device: torch.device, bf16: bool) -> str:
    if device.type != "cuda":
        return "cpu: peak FLOP/s unknown (no CPU peak table here), so no MFU"
    name = torch.cuda.get_device_name(device)
    return describe(name) if bf16 else f"{name}: float32 peak unknown (benchmarks/gpu_peaks.py lists bf16), so no MFU"


# --batch auto's ceiling: llm.c's GPT-2 124M micro-batch (64 × 1024 tokens, a step well past the launch-bound
# sizes). The 2026-11-28 H200 check sized by memory alone, got 284 sequences (291k tokens a step), and its
# compile and warm-up outlasted the step's 156 s: what fits is not what a benchmark needs.
AUTO_BATCH_CAP = 64


def auto_batch(cfg: GPTConfig, device: torch.device, bf16: bool, fallback: int) -> int:
    """--batch auto: on CUDA the largest micro-batch the free memory holds for the largest variant (an
    estimate, gpt/memory.py), at most AUTO_BATCH_CAP; elsewhere `fallback` (the CPU's memory is not the bound
    worth sizing to)."""
    if device.type != "cuda":
        return fallback
    free, _ = torch.cuda.mem_get_info(device)
    largest = max((model_config(v, replace(cfg)) for v in VARIANTS.values()), key=lambda c: count_meta(c)["total"])
    fits = fit_micro_batch(largest, count_meta(largest)["total"], free, bf16)
    if fits < 1:
        sys.exit(f"--batch auto: not one sequence of the {count_meta(largest)['total'] / 1e6:.1f}M model fits in "
                 f"{free / 2**30:.1f} GiB free")
    return min(fits, AUTO_BATCH_CAP)


def bench(cfg: GPTConfig, batch: int, steps: int, warmup: int, device: torch.device, compile: bool,
          bf16: bool) -> dict:
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    s = TrainSettings(steps=steps, micro_batch=batch, grad_accum=1, lr=6e-4, min_lr=6e-5, warmup_steps=0,
                      decay_steps=steps, weight_decay=0.1)
    opt = make_optimizer(model, s, device)
    run = torch.compile(model) if compile else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), device=device)
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast(device, torch.bfloat16 if bf16 else None):
            _, loss = run(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    tokens = batch * cfg.block_size
    tps = tokens / statistics.median(times)
    n = count_meta(cfg)["total"]
    peak = peak_flops(device, bf16)
    return {"tokens_per_s": tps, "step_s": statistics.median(times), "params_m": n / 1e6,
            "flops_per_token": flops_per_token(cfg, n),
            "mfu": tps * flops_per_token(cfg, n) / peak if peak else None,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", action="store_true",
                    help="GPT-2 124M shape on this device (CUDA: bf16, compile, --batch auto; CPU: float32, batch 1)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", default=None, help="sequences per step, or auto (CUDA: the most that fit)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --paper on the CPU 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --paper on the CPU 1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None, help="best of (default 2; --paper on the CPU 1)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="bfloat16 = autocast over float32 weights (default on CUDA), float32 (default on the CPU)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    return ap.parse_args()


def plan(args: argparse.Namespace, device: torch.device) -> tuple[GPTConfig, dict]:
    """The base shape and the run's settings, the --paper defaults filled in where a flag left None."""
    cuda = device.type == "cuda"
    paper_cpu = args.paper and not cuda
    if args.paper:
        base = GPTConfig()  # 12 layers, 12 heads, d 768, T 1024, vocabulary 50 304
    else:
        base = GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                         d_model=args.d_model, mlp_hidden=4 * args.d_model)
    bf16 = (args.dtype or ("bfloat16" if cuda else "float32")) == "bfloat16"
    fallback = 1 if paper_cpu else 8
    batch = args.batch or ("auto" if args.paper and cuda else str(fallback))
    return base, {
        "batch": auto_batch(base, device, bf16, fallback) if batch == "auto" else int(batch),
        "steps": args.steps or (2 if paper_cpu else 10),
        "warmup": args.warmup if args.warmup is not None else (1 if paper_cpu else 3),
        "rounds": args.rounds or (1 if paper_cpu else 2),
        "compile": args.compile or (args.paper and cuda),
        "bf16": bf16,
        "batch_source": (f"auto: what the free memory holds, at most {AUTO_BATCH_CAP}" if batch == "auto" and cuda
                         else "given"),
    }


def report(name: str, r: dict) -> str:
    mfu = f"MFU {100 * r['mfu']:5.1f}%" if r["mfu"] is not None else "MFU n/a (peak unknown)"
    mem = f"  peak mem {r['peak_mem_gib']:.1f} GiB" if r["peak_mem_gib"] is not None else ""
    return (f"{name:24s} {r['params_m']:7.2f}M params  {r['tokens_per_s']:10.0f} tokens/s (median step "
            f"{r['step_s']:.2f} s)  {r['flops_per_token'] / 1e9:.3f} GFLOP/token  {mfu}{mem}")


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base, p = plan(args, device)
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"threads {torch.get_num_threads()}, shape L={base.n_layer} H={base.n_head} d={base.d_model} "
          f"T={base.block_size} V={base.vocab_size}, batch {p['batch']} sequences ({p['batch_source']}), "
          f"{'bf16 autocast' if p['bf16'] else 'float32'}, compile {p['compile']}, "
          f"{p['steps']} timed steps after {p['warmup']}, best of {p['rounds']}")
    print(peak_line(device, p["bf16"]))
    print("params: total, the tied head counted once; FLOP/token: 6N + 12·L·d·T (forward + backward)")
    rows: dict[str, dict] = {}
    # rounds over the variants, best of the rounds per variant: on a shared machine the best round is
    # the one least disturbed by other work
    for _ in range(p["rounds"]):
        for name in args.variants.split(","):
            cfg = model_config(VARIANTS[name], replace(base))
            r = bench(cfg, p["batch"], p["steps"], p["warmup"], device, p["compile"], p["bf16"])
            print(report(name, r), flush=True)  # at once: a run stopped at a time limit keeps what it measured
            if name not in rows or r["tokens_per_s"] > rows[name]["tokens_per_s"]:
                rows[name] = r
    if p["rounds"] > 1:
        print(f"best of {p['rounds']} rounds:")
        for name, r in rows.items():
            print(report(name, r), flush=True)
    if "wq_identity_117m" in rows and "baseline_124m" in rows:
        ratio = rows["wq_identity_117m"]["tokens_per_s"] / rows["baseline_124m"]["tokens_per_s"]
        verdict = "OK" if ratio >= 0.97 else "SLOWER"  # 3 %: timing noise on a shared machine
        print(f"W_Q = I (117M) / baseline (124M) throughput: {ratio:.3f}  [{verdict}: target >= 1 within 3% noise]")


if __name__ == "__main__":
    main()
