"""What the check runs, in three phases: `functional` (lanes side by side: the probe, the CUDA tests,
every family's tiny model and the MoE fit on the device, every experiment at preset=smoke, rnn_context
with TF32 off and on, gemma_match on the 1B shapes through the parallel launcher, gpt_wq at the gpu preset's
shape under torchrun, compiled, bf16 autocast), `timings` (the GPU alone: patch_bench on the 1B shapes in
bfloat16, every variant; the stock step eager, with a static cache and compiled; the patched step compiled;
gpt_wq_bench --paper, GPT-2 124M's shape: tokens/s and MFU; the largest shape), then `cpu` (what failed, again
on the CPU: a CUDA bug passes there, a version gap fails on both; built by `cpu_reruns` from the results).

`fake` runs the same steps on the CPU at the smallest sizes (tiny models, the smoke shapes, no compile):
the check's own plumbing end to end on a machine without a GPU."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.gpu_check.steps import Step

BIG_MODEL = "gemma3-1b-random"  # Gemma 3 1B's shapes, random weights built from its config: nothing to download
TINY_MODEL = "tiny-gemma3"
PAPERS = (("dherin", ("dherin",)), ("goldwaser", ("goldwaser",)), ("karbevski_xu_fang", ("karbevski", "xu_fang")))
# The phases' caps within the default 450 s: the timings need the GPU alone afterwards, and what is left
# (at least 40 s) goes to the CPU re-runs
FUNCTIONAL_S = 160
PHASES = ("functional", "timings")  # what build returns, in order (the cpu re-runs come after, from the results)
TIMINGS_S = 240


@dataclass(frozen=True)
class Phase:
    name: str
    lanes: list[list[Step]]
    cap_s: float | None = None  # at most this long (and never past the check's deadline)


def build(python: str, work: Path, out: Path, experiments: dict[str, str], fake: bool,
          tiny_models: tuple[str, ...] = ()) -> list[Phase]:
    """The phases for a GPU box, or (`fake`) their CPU stand-ins. `experiments`: name -> paper package;
    `tiny_models`: every patchable family's tiny random model (each adapter once on the device)."""
    device = "cpu" if fake else "cuda"
    big = TINY_MODEL if fake else BIG_MODEL
    cli = [python, "-m", "cli.main"]
    runs = work / "runs"

    def run(name: str, *args: str) -> list[str]:
        return [*cli, "run", *args, f"hydra.run.dir={runs / name}"]

    probe = [Step("01_probe", "versions, TF32 flags and what they do to float32 matmuls and nn.RNN, matmul TFLOP/s",
                  [python, "-m", "benchmarks.gpu_check.probe", str(out / "probe.json")], 120),
             Step("02_pytest_gpu", "the CUDA-marked tests (pytest -m gpu)",
                  [python, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"], 150)]
    if tiny_models:
        families = ["patch_match", "-m", "preset=smoke", f"model={','.join(tiny_models)}"]
        probe.append(Step("03_patch_match_tiny_families", f"patch_match on every family's tiny model on {device}",
                          [*cli, "run", *families, f"device={device}", f"hydra.sweep.dir={runs / 'tiny_families'}"],
                          120, runs=str(runs / "tiny_families"),
                          cpu_argv=[*cli, "run", *families, "device=cpu",
                                    f"hydra.sweep.dir={runs / 'tiny_families_cpu'}"]))
    if "tiny-mixtral" in tiny_models:  # the MoE rule's fit: its tensors must all be on the model's device
        moe = ["context_compile", "preset=smoke", "model=tiny-mixtral"]
        probe.append(Step("04_context_compile_moe", f"context_compile on tiny-mixtral (MoE) on {device}",
                          run("context_compile_moe", *moe, f"device={device}"), 60,
                          runs=str(runs / "context_compile_moe"),
                          cpu_argv=run("context_compile_moe_cpu", *moe, "device=cpu")))
    # Goldwaser Fig. 5's path: an image as the context of a multimodal Gemma 3 (SigLIP tower), float64 end to end
    image = ["gemma_match", "preset=smoke", "model=tiny-gemma3-vision", "image=synthetic", "dtype=float64",
             "prompts=[]", "max_new_tokens=6"]
    probe.append(Step("05_gemma_match_image", f"gemma_match with an image as the context (Fig. 5's path) on {device}",
                      run("gemma_match_image", *image, f"device={device}"), 60, runs=str(runs / "gemma_match_image"),
                      cpu_argv=run("gemma_match_image_cpu", *image, "device=cpu")))
    smoke = []
    for lane, packages in PAPERS:
        names = sorted(n for n, p in experiments.items() if p in packages)
        if names:
            folder = work / "smoke" / lane
            smoke.append([Step(f"1{len(smoke)}_smoke_{lane}", f"{', '.join(names)} at preset=smoke device={device}",
                               [*cli, "reproduce", "--only", ",".join(names), "--results", str(folder),
                                "preset=smoke", f"device={device}"], 200, runs=str(folder), reproduce=True)])
    rnn = ["rnn_context", "preset=smoke", f"device={device}"]
    gemma = ["gemma_match", "-m", "hydra/launcher=parallel", "preset=smoke", f"model={big}",
             "dtype=float32,bfloat16", "variant=stable", "max_new_tokens=12"]
    chain = [Step("20_rnn_context_tf32_off", "rnn_context's claims as the runner sets precision (IEEE float32)",
                  run("rnn_context_tf32_off", *rnn), 60, runs=str(runs / "rnn_context_tf32_off"),
                  cpu_argv=run("rnn_context_tf32_off_cpu", *rnn[:-1], "device=cpu")),
             Step("21_rnn_context_tf32_on", "rnn_context with TF32 forced on before the run starts",
                  [python, "-m", "benchmarks.gpu_check.with_tf32", "run", *rnn,
                   f"hydra.run.dir={runs / 'rnn_context_tf32_on'}"], 60, runs=str(runs / "rnn_context_tf32_on")),
             Step("22_gemma_match_parallel", f"gemma_match on {big}, float32 and bfloat16, hydra/launcher=parallel",
                  [*cli, "run", *gemma, f"device={device}", f"hydra.sweep.dir={runs / 'gemma_match_parallel'}"], 150,
                  runs=str(runs / "gemma_match_parallel"),
                  cpu_argv=[*cli, "run", *gemma[:4], f"model={TINY_MODEL}", *gemma[5:], "device=cpu",
                            f"hydra.sweep.dir={runs / 'gemma_match_parallel_cpu'}"])]
    # gpt_wq under torchrun (compile + DDP + NCCL) is a functional check: its lane shares the GPU, so its
    # tokens/s are a floor; the throughput that counts is gpt_wq_bench's, with the GPU alone
    # most wanted first (a phase past its cap skips what is left): the compiled stock step and gpt_wq's MFU at
    # the paper's shape have never been measured on a GPU; the variants' rows have (docs/benchmarks.md)
    # (the float32 rows, measured on the 2026-11-28 H200, make room for the compiled patched step)
    timings = [stock_compiled(python, out, big, device, fake), patched_compiled(python, out, big, device, fake),
               gpt_wq_paper(python, fake), bench(python, out, "bfloat16", big, device, fake),
               largest(python, out, device, fake)]
    return [Phase("functional", [probe, *smoke, chain, [gpt_wq(python, work, fake)]], FUNCTIONAL_S),
            Phase("timings", [timings], TIMINGS_S)]


def bench(python: str, out: Path, dtype: str, model: str, device: str, fake: bool) -> Step:
    """patch_bench: stock `generate` vs patched generation, every variant, time per token and peak memory, the
    patched step eager and recorded as a CUDA graph (`--graphs off,on`; the CPU re-run: eager). Stock eager
    here; the compiled stock step is a step of its own (`stock_compiled`), so that a failed compile costs no
    variant's row."""

    def argv(device: str, model: str, tokens: int, name: str) -> list[str]:
        return [python, "benchmarks/patch_bench.py", "--device", device, "--model", model, "--dtype", dtype,
                "--variant", "all", "--modes", "generate,patched", "--tokens", str(tokens), "--stock", "eager",
                "--graphs", graph_rows(device), "--json", str(out / "bench" / f"{name}.json")]

    return Step(f"3{1 if dtype == 'float32' else 2}_patch_bench_{dtype}",
                f"patched vs stock generation on {model} in {dtype}, every variant (ms/token, peak memory)",
                argv(device, model, 3 if fake else 8, f"patch_{dtype}"), 60,
                cpu_argv=argv("cpu", TINY_MODEL, 3, f"patch_{dtype}_cpu"))


def graph_rows(device: str) -> str:
    """patch_bench's --graphs: the patched step eager and recorded as a CUDA graph on a GPU; eager on the CPU."""
    return "off" if device == "cpu" else "off,on"


def stock_compiled(python: str, out: Path, model: str, device: str, fake: bool) -> Step:
    """The honest stock baseline (issue 54): `generate` eager, with transformers' static KV cache, and with it
    and the decoding step compiled (`reduce-overhead`: CUDA graphs), in bfloat16, one process. The fake check
    stops at the static cache (compiling on a CPU takes minutes)."""
    stock = "eager,static" if fake else "eager,static,compiled"
    argv = [python, "benchmarks/patch_bench.py", "--device", device, "--model", model, "--dtype", "bfloat16",
            "--modes", "generate", "--stock", stock, "--tokens", "3" if fake else "32",
            "--json", str(out / "bench" / "stock_bfloat16.json")]
    return Step("33_stock_compiled_bfloat16", f"stock generate on {model} in bfloat16: {stock} (ms/token)", argv, 150)


def patched_compiled(python: str, out: Path, model: str, device: str, fake: bool) -> Step:
    """The patched step compiled once (`--step-compile on`; with `--graphs on`, reduce-overhead: inductor's
    kernels in CUDA graphs), naive and closed_loop in bfloat16, beside stock eager: never yet measured on a GPU. The
    fake check runs the step uncompiled on the tiny model (compiling on a CPU takes minutes)."""
    argv = [python, "benchmarks/patch_bench.py", "--device", device, "--model", TINY_MODEL if fake else model,
            "--dtype", "bfloat16", "--variant", "naive,closed_loop", "--modes", "generate,patched",
            "--tokens", "3" if fake else "16", "--stock", "eager", "--graphs", graph_rows(device).split(",")[-1],
            "--step-compile", "off" if fake else "on", "--json", str(out / "bench" / "patched_compiled.json")]
    return Step("36_patched_compiled_bfloat16", f"the patched step compiled on {model} in bfloat16 (ms/token)", argv,
                120)


def gpt_wq_paper(python: str, fake: bool) -> Step:
    """gpt_wq_bench at GPT-2 124M's shape (T 1024, V 50,304), bf16 autocast, compiled, the largest micro-batch
    that fits: tokens/s and MFU for the baseline and W_Q = I (the fake check: a small CPU shape)."""
    shape = ["--vocab", "320", "--layers", "2", "--d-model", "64", "--block", "32", "--steps", "2", "--warmup", "1"] \
        if fake else ["--paper", "--steps", "8", "--warmup", "2"]
    argv = [python, "benchmarks/gpt_wq_bench.py", *shape, "--rounds", "1",
            "--variants", "baseline_124m,wq_identity_117m"]
    return Step("34_gpt_wq_paper", "gpt_wq_bench --paper: GPT-2 124M's shape, compiled, bf16: tokens/s, MFU", argv, 150)


def largest(python: str, out: Path, device: str, fake: bool) -> Step:
    """The largest Gemma 3 shape an H200 holds in bfloat16 with an open loop's patched matrices beside it
    (Gemma 3 27B: 54 GB of weights, 43 GB of patched MLP matrices), built on the card (patch_bench's
    `gemma3-27b-shape`): stock eager against naive and closed_loop, eager and recorded (the fake check: the tiny
    model)."""
    model = TINY_MODEL if fake else "gemma3-27b-shape"
    argv = [python, "benchmarks/patch_bench.py", "--device", device, "--model", model, "--dtype", "bfloat16",
            "--variant", "naive,closed_loop", "--modes", "generate,patched", "--tokens", "3" if fake else "4",
            "--stock", "eager", "--graphs", graph_rows(device),
            "--json", str(out / "bench" / "largest_bfloat16.json")]
    return Step("35_patch_bench_largest_bfloat16", f"patched vs stock generation on {model} in bfloat16", argv, 60)


def gpt_wq(python: str, work: Path, fake: bool) -> Step:
    """gpt_wq for ~30 steps under torchrun (one rank), compiled, bf16 autocast: tokens/s and MFU (a floor: it
    shares the GPU with the functional phase's other lanes)."""
    folder = work / "runs" / "gpt_wq_torchrun"
    shape = ["preset=smoke", "device=cpu", "train.compile=false"] if fake else \
        ["preset=gpu", "device=cuda", "train.compile=true"]
    common = ["gpt_wq", "data=fixture", "tokenizer=bytes", "dtype=bfloat16", "variant=baseline_124m",
              "train.steps=30", "train.log_every=10", "train.eval_every=30", "train.checkpoint_every=30",
              "train.val_windows=16", "export_hf=false", f"cache_dir={work / 'cache'}"]
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "cli.main", "run"]
    cpu = [*torchrun, *common, "preset=smoke", "device=cpu", "train.compile=false", "train.steps=6",
           f"hydra.run.dir={work / 'runs' / 'gpt_wq_torchrun_cpu'}"]
    return Step("30_gpt_wq_torchrun", f"gpt_wq at the {shape[0]} shape, 30 steps, {shape[2]}, bf16 autocast, torchrun "
                "--nproc_per_node=1: tokens/s, MFU", [*torchrun, *common, *shape, f"hydra.run.dir={folder}"], 120,
                runs=str(folder), cpu_argv=cpu)


def failed_experiments(folder: Path, names: list[str]) -> list[str]:
    """The experiments of a reproduce folder whose run did not complete (or never started)."""
    bad = []
    for name in names:
        found = [json.loads(p.read_text()).get("status") for p in (folder / name).rglob("run.json")]
        if not found or any(s != "complete" for s in found):
            bad.append(name)
    return bad


def cpu_reruns(phases: list[Phase], results: dict[str, str], python: str, work: Path) -> Phase:
    """The `cpu` phase: every failed or timed-out step that has a CPU form, with CUDA hidden; for a reproduce
    step, only its experiments that did not complete (with what they need: reproduce adds it)."""
    lanes: list[list[Step]] = [[], []]
    for phase in phases:
        for lane in phase.lanes:
            for step in lane:
                if results.get(step.name) not in ("failed", "timed_out"):
                    continue
                argv = step.cpu_argv
                if step.reproduce:
                    names = step.argv[step.argv.index("--only") + 1].split(",")
                    bad = failed_experiments(Path(step.runs), names)
                    folder = work / "smoke_cpu" / step.name
                    argv = [python, "-m", "cli.main", "reproduce", "--only", ",".join(bad), "--results", str(folder),
                            "preset=smoke", "device=cpu"] if bad else None
                if argv:
                    rerun = replace(step, name=f"{step.name}.cpu", what=f"on the CPU: {step.what}", argv=argv,
                                    timeout_s=120, env={"CUDA_VISIBLE_DEVICES": ""}, cpu_argv=None,
                                    runs=str(folder) if step.reproduce else step.runs)
                    min(lanes, key=len).append(rerun)
    return Phase("cpu", [lane for lane in lanes if lane])
