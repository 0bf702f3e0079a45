"""Training throughput of the five gpt_wq variants (Karbevski & Mijoski Table 2).

    python benchmarks/gpt_wq_bench.py                 # CPU: L=4, d=128, T=128, GPT-2 vocabulary
    python benchmarks/gpt_wq_bench.py --vocab 320     # CPU: the cpu preset's byte-level shape
    python benchmarks/gpt_wq_bench.py --paper         # CUDA: the paper's shape, bf16 autocast, torch.compile

One optimizer step = forward + backward + clip + AdamW on random token windows, timed after warm-up steps;
tokens/s is the median over the timed steps, best of --rounds rounds. On CUDA the model FLOPs utilization
is reported against the GPU's dense bf16 peak read from its name (benchmarks/gpu_peaks.py: H100 SXM,
PCIe and NVL apart; an unknown card or a MIG slice is named and gets no MFU), with PaLM's 6N + 12·L·d·T
FLOPs per token, as nanoGPT's estimate_mfu. Target: W_Q = I (117M) must not be slower than the 124M
baseline (it has less work: no query projection). Prints a table; not a test.
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
from experiments.karbevski.gpt.model import GPT, GPTConfig, flops_per_token  # noqa: E402
from experiments.karbevski.gpt.params import count_meta  # noqa: E402
from experiments.karbevski.gpt.train import TrainSettings, autocast, make_optimizer  # noqa: E402
from experiments.karbevski.gpt.variants import VARIANTS, model_config  # noqa: E402


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    found = peak_bf16(torch.cuda.get_device_name(device))
    return found[0] if found else None


def bench(cfg: GPTConfig, batch: int, steps: int, warmup: int, device: torch.device, compile: bool) -> dict:
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
        with autocast(device, torch.bfloat16 if device.type == "cuda" else None):
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
    peak = peak_flops(device)
    return {"tokens_per_s": tps, "params_m": n / 1e6,
            "mfu": tps * flops_per_token(cfg, n) / peak if peak else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", action="store_true", help="the paper's shape on CUDA (bf16, compile)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.paper:
        if device.type != "cuda":
            sys.exit("--paper needs a CUDA GPU")
        base, batch, compile = GPTConfig(), args.batch if args.batch != 8 else 12, True
    else:
        base = GPTConfig(vocab_size=args.vocab, block_size=args.block, n_layer=args.layers, n_head=args.heads,
                         d_model=args.d_model, mlp_hidden=4 * args.d_model)
        batch, compile = args.batch, args.compile
    print(f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"threads {torch.get_num_threads()}, shape L={base.n_layer} d={base.d_model} T={base.block_size} "
          f"V={base.vocab_size}, batch {batch}, compile {compile}")
    if device.type == "cuda":
        print(describe(torch.cuda.get_device_name(device)))
    rows: dict[str, dict] = {}
    # rounds over the variants, best of the rounds per variant: on a shared machine the best round is
    # the one least disturbed by other work
    for _ in range(args.rounds):
        for name in args.variants.split(","):
            r = bench(model_config(VARIANTS[name], replace(base)), batch, args.steps, args.warmup, device, compile)
            if name not in rows or r["tokens_per_s"] > rows[name]["tokens_per_s"]:
                rows[name] = r
    for name, r in rows.items():
        mfu = f"  MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else ""
        print(f"{name:24s} {r['params_m']:8.2f}M params  {r['tokens_per_s']:10.0f} tokens/s{mfu}", flush=True)
    if "wq_identity_117m" in rows and "baseline_124m" in rows:
        ratio = rows["wq_identity_117m"]["tokens_per_s"] / rows["baseline_124m"]["tokens_per_s"]
        verdict = "OK" if ratio >= 0.97 else "SLOWER"  # 3 %: timing noise on a shared machine
        print(f"W_Q = I (117M) / baseline (124M) throughput: {ratio:.3f}  [{verdict}: target >= 1 within 3% noise]")


if __name__ == "__main__":
    main()
