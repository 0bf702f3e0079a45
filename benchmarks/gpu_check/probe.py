"""The box as the runs meet it, into one JSON file: versions, the GPU, the TF32 flags and environment
variables, what TF32 does to a float32 matmul and to nn.RNN (rnn_context's layer, through cuDNN) against
float64, and matmul TFLOP/s in float64, float32 and bfloat16 (float64's fraction decides how long a
float64 run takes). Without CUDA (the fake check) only the versions and the CPU errors."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import torch

MODULES = ("transformers", "hydra", "omegaconf", "antlr4", "peft", "typer", "rich", "pandas", "matplotlib",
           "jinja2", "joblib", "safetensors", "tokenizers", "yaml", "pytest", "triton", "tiktoken", "gguf",
           "accelerate", "submitit")
ENV = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES",
       "PYTORCH_CUDA_ALLOC_CONF")


def versions() -> dict:
    found = {}
    for name in MODULES:
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "present")
        except Exception:
            found[name] = None
    return {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_build": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), **found}


def flags() -> dict:
    found = {"cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    # torch >= 2.9's per-backend settings, where this torch has them
    for path in ("backends", "backends.cuda.matmul", "backends.cudnn", "backends.cudnn.conv", "backends.cudnn.rnn"):
        owner = torch
        for part in path.split("."):
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, "fp32_precision"):
            found[f"torch.{path}.fp32_precision"] = str(owner.fp32_precision)
    return found


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref).abs().max() / ref.abs().max())


def tf32_effect(device: torch.device) -> dict:
    """Relative error against float64 of a float32 matmul and a float32 nn.RNN, TF32 off and on."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1024, 1024, generator=g, dtype=torch.float64) for _ in range(2))
    rnn64 = torch.nn.RNN(33, 64, batch_first=True).double()
    x = torch.randn(16, 40, 33, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ref_mm, ref_rnn = a @ b, rnn64(x)[0]
    keep = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    out = {}
    try:
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            rnn = torch.nn.RNN(33, 64, batch_first=True).to(device)
            rnn.load_state_dict({k: v.float() for k, v in rnn64.state_dict().items()})
            with torch.no_grad():
                out[f"tf32_{'on' if tf32 else 'off'}"] = {
                    "matmul": rel_error(a.float().to(device) @ b.float().to(device), ref_mm),
                    "rnn": rel_error(rnn(x.float().to(device))[0], ref_rnn)}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = keep
    return out


def tflops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 5) -> float:
    p, q = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    p @ q
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        p @ q
    torch.cuda.synchronize(device)
    return round(2 * n**3 * reps / (time.perf_counter() - t0) / 1e12, 1)


def main(path: str) -> None:
    report = {**versions(), "precision_flags": flags(), "env": {k: os.environ.get(k) for k in ENV},
              "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count()}
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["capability"] = list(torch.cuda.get_device_capability(device))
        report["memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    report["rel_error_vs_float64"] = {device.type: tf32_effect(device)}
    if device.type == "cuda":
        report["matmul_tflops"] = {str(d).removeprefix("torch."): tflops(device, d)
                                   for d in (torch.float64, torch.float32, torch.bfloat16)}
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
