"""benchmarks/gpt_wq_bench.py without running a model: --paper is GPT-2 124M on any device (on the CPU a few
steps of one sequence, float32), --batch auto keeps the CPU's batch, and each printed number says what it is."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import gpt_wq_bench as bench
from experiments.karbevski.gpt.model import GPTConfig

CPU = torch.device("cpu")


def plan(monkeypatch, *flags: str):
    monkeypatch.setattr(sys, "argv", ["gpt_wq_bench.py", *flags])
    return bench.plan(bench.parse_args(), CPU)


def test_paper_on_the_cpu_is_gpt2_small_in_a_few_steps(monkeypatch):
    base, p = plan(monkeypatch, "--paper")
    assert base == GPTConfig()
    assert (base.n_layer, base.n_head, base.d_model, base.block_size, base.vocab_size) == (12, 12, 768, 1024, 50304)
    assert p == {"batch": 1, "steps": 2, "warmup": 1, "rounds": 1, "compile": False, "bf16": False,
                 "batch_source": "given"}
    _, p = plan(monkeypatch, "--paper", "--batch", "auto", "--steps", "3")
    assert (p["batch"], p["steps"]) == (1, 3)  # auto sizes to a GPU's memory only


@pytest.mark.parametrize("bf16", [True, False])
def test_no_mfu_without_a_known_peak(bf16):
    assert bench.peak_flops(CPU, bf16) is None
    assert "unknown" in bench.peak_line(CPU, bf16)


def test_the_row_names_its_units():
    row = bench.report("baseline_124m", {"params_m": 124.37, "tokens_per_s": 850.0, "step_s": 1.2,
                                         "flops_per_token": 8.4e8, "mfu": None, "peak_mem_gib": None})
    assert "tokens/s (median step 1.20 s)" in row and "GFLOP/token" in row and "MFU n/a (peak unknown)" in row
    row = bench.report("x", {"params_m": 1, "tokens_per_s": 1, "step_s": 1, "flops_per_token": 1, "mfu": 0.291,
                             "peak_mem_gib": 3.0})
    assert "MFU  29.1%" in row and "peak mem 3.0 GiB" in row


@pytest.mark.parametrize("free_gib,expected", [(139, bench.AUTO_BATCH_CAP), (16, None)])
def test_batch_auto_on_a_gpu_is_what_fits_at_most_the_cap(monkeypatch, free_gib, expected):
    """The H200's 139 GiB held 284 sequences by memory, whose compile outlasted the check's step: auto stops at
    the cap; a small card gets what fits, below it."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_gib * 2**30, free_gib * 2**30))
    batch = bench.auto_batch(GPTConfig(), torch.device("cuda"), True, 8)
    if expected is None:
        assert 1 <= batch < bench.AUTO_BATCH_CAP
    else:
        assert batch == expected
