"""float32 means IEEE float32 on every device (docs/design.md, Numerics): the runner pins the precision of
float32 matmuls and cuDNN (convolutions, RNNs) before each run, and run.json's `precision` says what ran.

Left alone, what a run computes in is nobody's choice: cuDNN allows TF32 by default (rnn_context's nn.RNN
on CUDA), and a notebook that called `torch.set_float32_matmul_precision("high")` before the Python API
(docs/python.md) would move every float32 claim after it to TF32's ~1e-3. So every run sets its precision
(IEEE unless its config asks for `tf32=true`), and says when an earlier call had turned TF32 on.
`NVIDIA_TF32_OVERRIDE` is read by NVIDIA's libraries, not by torch, which cannot undo it: 0 forces IEEE (as
pinned here anyway); any other value is recorded as TF32 for a float32 run on CUDA, with a note beside its
claims, since this process cannot show that its float32 matmuls were IEEE."""

from __future__ import annotations

import os

import torch

TF32_ENV = "NVIDIA_TF32_OVERRIDE"


def _per_op():
    """torch's per-operator switches (torch >= 2.9: `fp32_precision`), or None for the older flags. Once the
    per-operator API has been used in a process, reading the older flags raises, so this one is preferred."""
    b = torch.backends
    if hasattr(b.cuda.matmul, "fp32_precision") and hasattr(b.cudnn, "rnn"):
        return {"cuBLAS matmul": b.cuda.matmul, "cuDNN conv": b.cudnn.conv, "cuDNN RNN": b.cudnn.rnn}
    return None


def tf32_paths() -> list[str]:
    """The float32 paths that would run TF32 now, as this process has set them."""
    ops = _per_op()
    if ops is not None:
        on = [name for name, op in ops.items() if op.fp32_precision == "tf32"]
    else:
        on = [name for name, flag in (("cuBLAS matmul", torch.backends.cuda.matmul.allow_tf32),
                                      ("cuDNN", torch.backends.cudnn.allow_tf32)) if flag]
    if torch.get_float32_matmul_precision() != "highest" and "cuBLAS matmul" not in on:
        on.insert(0, f"matmul precision {torch.get_float32_matmul_precision()!r}")
    return on


def set_tf32(on: bool) -> None:
    """TF32 (on) or IEEE float32 (off) for float32 matmuls and cuDNN, whatever the process set before."""
    ops = _per_op()
    if ops is not None:
        for op in ops.values():
            op.fp32_precision = "tf32" if on else "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def tf32_forced_outside() -> str | None:
    """`NVIDIA_TF32_OVERRIDE=V` when the environment may turn TF32 on behind torch's back (any value but 0)."""
    value = os.environ.get(TF32_ENV, "").strip()
    return f"{TF32_ENV}={value}" if value not in ("", "0") else None


def set_deterministic(on: bool) -> None:
    """Deterministic kernels (bit-equal reruns, resumes and DDP ranks on CUDA; CPU kernels already are), or
    torch's default. cuBLAS reads its workspace setting when it starts, which is after the run's setup."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on, warn_only=True)  # an op without a deterministic kernel warns
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = on


def flags(config) -> dict[str, bool]:
    """pin()'s tf32= and deterministic= from a run's config: keys only the experiments that offer them declare
    (gpt_wq); the others run IEEE float32 with torch's default kernels."""
    return {"tf32": getattr(config, "tf32", False), "deterministic": getattr(config, "deterministic", False)}


def pin(device: torch.device, dtype: torch.dtype, tf32: bool = False,
        deterministic: bool = False) -> tuple[str, list[str]]:
    """Set the run's float32 precision (and its kernels' determinism); return what run.json's `precision`
    says and the notes to print: `float32 (IEEE)`, `float64 (IEEE)`, `tf32` (asked for), `bfloat16` ...,
    `, deterministic` where asked, and a note where TF32 had been turned on before the run (now reset) or is
    forced by the environment (not undoable)."""
    set_deterministic(deterministic)
    said, notes = _pin(device, dtype, tf32)
    return (f"{said}, deterministic" if deterministic else said), notes


def _pin(device: torch.device, dtype: torch.dtype, tf32: bool) -> tuple[str, list[str]]:
    notes = []
    earlier = [path for path in tf32_paths() if "matmul" in path]  # cuDNN's TF32 is torch's default, not a choice
    if earlier and not tf32:
        notes.append(f"TF32 had been turned on in this process before the run ({', '.join(earlier)}); "
                     "the run reset it to IEEE float32")
    set_tf32(tf32)
    if dtype not in (torch.float32, torch.float64):
        return str(dtype).removeprefix("torch."), notes  # bfloat16, float16: TF32 is a float32 matter
    if dtype == torch.float32 and tf32:
        return "tf32", notes
    forced = tf32_forced_outside() if device.type == "cuda" and dtype == torch.float32 else None
    if forced:
        notes.append(f"{forced} in the environment: NVIDIA's libraries may run float32 matmuls in TF32, which "
                     f"torch cannot undo, so this run is recorded as tf32 and its float32 exactness claims do not "
                     f"show IEEE float32; unset {TF32_ENV} (or set it to 0)")
        return f"tf32 ({forced})", notes
    return f"{str(dtype).removeprefix('torch.')} (IEEE)", notes
