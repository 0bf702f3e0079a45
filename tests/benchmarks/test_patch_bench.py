"""patch_bench's CUDA path on the CPU: the meter reads the clock after a synchronize and the peak from the
caching allocator, reset before each mode; every mode and variant runs on one model in one process, and a
variant that fails leaves a row saying why, not a dead benchmark."""

from __future__ import annotations

import argparse

import torch

from benchmarks import patch_bench


def test_the_cuda_meter_synchronizes_and_reads_the_allocator(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * 2**20)
    meter = patch_bench.Meter("cuda:0")
    meter.now()
    assert calls == ["sync"]
    assert meter.reset_peak() == 3.0 and calls[-2:] == ["sync", "reset"]
    assert meter.peak_mb() == 5.0 and calls[-1] == "sync"


def test_every_mode_and_variant_on_one_model(monkeypatch):
    args = argparse.Namespace(model="tiny-gemma3", dtype="float32", device="cpu", threads=1, tokens=2,
                              apply="materialized")
    rows = patch_bench.one_process(args, ["generate", "patched"], ["naive", "no_such_variant"])
    assert [(r["mode"], r["variant"]) for r in rows] == [("generate", None), ("patched", "naive"),
                                                         ("patched", "no_such_variant")]
    assert rows[0]["ms_per_token"] > 0 and rows[1]["ms_per_token"] > 0 and rows[1]["peak_mb"] > 0
    assert "no_such_variant" in rows[2]["error"]


def test_a_plain_cuda_device_is_given_its_index_before_set_device(monkeypatch):
    """torch.cuda.set_device(torch.device("cuda")) raises; the benchmark's `--device cuda` must not reach it."""
    current = {"k": 0}

    def strict_set_device(device):
        if not isinstance(device, int) and torch.device(device).index is None:
            raise ValueError("Expected a torch.device with a specified index or an integer")
        current["k"] = device if isinstance(device, int) else torch.device(device).index

    monkeypatch.setattr(torch.cuda, "set_device", strict_set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["k"])
    assert patch_bench.bench_device("cuda") == torch.device("cuda", 0)
    assert patch_bench.bench_device("cuda:3") == torch.device("cuda", 3) and current["k"] == 3
    assert patch_bench.bench_device("cpu") == torch.device("cpu")
