"""What a card is good at, for the checks before a run: its float64 rate against its float32 rate (a
consumer or workstation card runs float64 at 1/32 or 1/64 of float32: a float64 run there takes that many
times longer), and whether torch.compile can work here (Triton for CUDA, a C compiler for either).

Read from the card's compute capability through torch.cuda.get_device_properties, which needs no CUDA
context (reading free memory would create one: zoo/loading.available_bytes)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import torch

# compute capability -> float32 rate / float64 rate (NVIDIA's CUDA C++ guide, "arithmetic instructions"):
# the HPC cards (P100, V100, A100, H100, B200) 2; Pascal and Turing consumer cards 32; Ampere A10/A40/RTX 30,
# Ada L4/L40/RTX 40, Blackwell RTX 50 64. A capability not listed gives no warning.
FLOAT64_SLOWDOWN: dict[tuple[int, int], int] = {
    (6, 0): 2, (7, 0): 2, (8, 0): 2, (9, 0): 2, (10, 0): 2,
    (6, 1): 32, (6, 2): 32, (7, 5): 32,
    (8, 6): 64, (8, 7): 64, (8, 9): 64, (12, 0): 64, (12, 1): 64,
}
WARN_FROM = 8  # a slowdown of 2 is what float64 costs anyway


def float64_slowdown(index: int) -> tuple[int, str] | None:
    """(float32 rate / float64 rate, the card's name) for GPU `index`, when the float64 rate is a small
    fraction (WARN_FROM or worse); None otherwise or for a card not in the table."""
    props = torch.cuda.get_device_properties(index)
    ratio = FLOAT64_SLOWDOWN.get((int(props.major), int(props.minor)))
    return (ratio, str(props.name)) if ratio and ratio >= WARN_FROM else None


def c_compiler() -> str | None:
    """The C compiler torch.compile's generated code needs (inductor's C++ on the CPU, Triton's launcher on
    CUDA): $CC / $CXX, or one on PATH."""
    for name in (os.environ.get("CXX"), os.environ.get("CC"), "g++", "c++", "clang++", "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def compile_missing(device_type: str) -> str | None:
    """What torch.compile lacks here for `device_type`, in words; None when nothing is missing."""
    missing = []
    if device_type == "cuda" and importlib.util.find_spec("triton") is None:
        missing.append("Triton (pip install triton)")
    if c_compiler() is None:
        missing.append("a C compiler (gcc or clang on PATH, or $CC)")
    return " and ".join(missing) or None
