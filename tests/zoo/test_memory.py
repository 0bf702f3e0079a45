"""The memory a model may take on a GPU (zoo/loading.available_bytes), with torch.cuda's functions faked:
on the run's own GPU the caching allocator's unused blocks count as free (a model freed before, as
layer_errors frees its float32 model before loading the float64 one, was refused near the limit), and
anywhere else the free memory is not read at all, since reading it creates a CUDA context that lives as
long as the process (the CLI's checks: on GPU 0 for every job, and once per torchrun rank)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from experiments.core import runtime
from experiments.zoo import loading

GIB = 1 << 30


@pytest.fixture
def gpu(monkeypatch):
    """GPU 0: 80 GiB, 1 GiB free as CUDA reports it, 10 GiB reserved by the caching allocator of which 2 GiB
    hold tensors. Reading the free memory is recorded (it would create a context)."""
    reads = []

    def mem_get_info(device=None):
        reads.append(device)
        return 1 * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 10 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * GIB)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(runtime, "RUN_GPUS", set())
    monkeypatch.setattr(loading, "RUN_GPUS", runtime.RUN_GPUS)
    return reads


def test_the_runs_gpu_counts_what_the_allocator_caches(gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    assert runtime.use_device(torch.device("cuda")) == torch.device("cuda", 0)  # the runner takes GPU 0
    assert loading.available_bytes("cuda:0") == (1 + 10 - 2) * GIB
    assert loading.available_bytes("cuda") == (1 + 10 - 2) * GIB  # a bare `cuda` is the current GPU
    assert gpu == [0, 0]


def test_the_clis_check_reads_no_free_memory(gpu):
    """No run in this process has taken the GPU: its total memory, without a context."""
    assert loading.available_bytes("cuda") == 80 * GIB
    assert loading.available_bytes(torch.device("cuda", 0)) == 80 * GIB
    assert gpu == []
