"""patch_bench's CUDA path on the CPU: the meter reads the clock after a synchronize and the peak from the
caching allocator, reset before each mode; every mode and variant runs on one model in one process, and a
variant that fails leaves a row saying why, not a dead benchmark."""

from __future__ import annotations

import argparse

import pytest
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


def test_every_mode_and_variant_on_one_model(monkeypatch, tmp_path, capsys):
    """...and each row is kept as it is measured (stderr, --json): a run stopped at a time limit keeps them."""
    args = argparse.Namespace(model="tiny-gemma3", dtype="float32", device="cpu", threads=1, tokens=2,
                              apply="materialized", json=tmp_path / "rows.json")
    kept = []
    monkeypatch.setattr(patch_bench, "write_json", lambda a, rows: kept.append(len(rows)))
    rows = patch_bench.one_process(args, ["generate", "patched"], ["naive", "no_such_variant"])
    assert [(r["mode"], r["variant"]) for r in rows] == [("generate", None), ("patched", "naive"),
                                                         ("patched", "no_such_variant")]
    assert rows[0]["ms_per_token"] > 0 and rows[1]["ms_per_token"] > 0 and rows[1]["peak_mb"] > 0
    assert "no_such_variant" in rows[2]["error"]
    assert kept == [1, 2, 3]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("measured: ")]
    assert len(lines) == 3 and "ms/token" in lines[0] and "no_such_variant" in lines[2]


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


def test_the_static_stock_row_runs_without_compile():
    """The stock static row (transformers' static KV cache, not compiled) beside the eager one on a tiny model; the
    time ratios then go to the faster row, peak memory to eager. No timing is asserted (machines differ)."""
    args = argparse.Namespace(model="tiny-gemma3", dtype="float32", device="cpu", threads=1, tokens=2,
                              apply="materialized", stock="eager,static")
    rows = patch_bench.one_process(args, ["generate", "patched"], ["naive"])
    assert [(r["mode"], r["stock"], r["variant"]) for r in rows] == [("generate", "eager", None),
                                                                     ("generate", "static", None),
                                                                     ("patched", None, "naive")]
    assert all("error" not in r and "ms_per_token" in r for r in rows)
    assert patch_bench.baseline(rows) is min(rows[:2], key=lambda r: r["ms_per_token"])
    assert patch_bench.memory_baseline(rows) is rows[0]


def test_the_static_row_is_transformers_static_cache_and_the_same_tokens():
    from transformers import StaticCache

    bundle, inputs = patch_bench.load("tiny-gemma3", "float32", "cpu", 1)
    common = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "pad_token_id": 0,
              "return_dict_in_generate": True}
    with torch.no_grad():
        eager = bundle.model.generate(**inputs, **common)
        static = bundle.model.generate(**inputs, **common, **patch_bench.stock_kwargs("static", "cpu"))
    assert isinstance(static.past_key_values, StaticCache)
    assert not isinstance(eager.past_key_values, StaticCache)
    assert torch.equal(static.sequences, eager.sequences)


def test_the_compiled_row_asks_transformers_to_compile():
    cpu = patch_bench.stock_kwargs("compiled", "cpu")
    assert cpu["cache_implementation"] == "static"
    assert cpu["compile_config"].mode == "default" and cpu["compile_config"]._compile_all_devices
    assert patch_bench.stock_kwargs("compiled", "cpu", "max-autotune")["compile_config"].mode == "max-autotune"
    assert patch_bench.compile_mode("cuda:0") == "reduce-overhead"
    assert patch_bench.stock_kwargs("static", "cuda:0")["disable_compile"]  # a static cache alone compiles on CUDA
    assert patch_bench.stock_kwargs("eager", "cpu") == {}


def test_without_torch_compile_one_line_and_the_compiled_row_skipped(monkeypatch, capsys):
    def no_compiler(*_args, **_kwargs):
        raise RuntimeError("InductorError: no working C compiler found\n  (a long traceback)")

    monkeypatch.setattr(torch, "compile", no_compiler)
    why = patch_bench.compile_unavailable("cpu")
    assert why is not None and "no working C compiler" in why and "\n" not in why

    seen = {}

    def fake_run_all(args, modes, variants):
        seen["stock"] = args.stock
        return [{"mode": "generate", "variant": None, "apply": None, "stock": "eager", "ms_per_token": 2.0,
                 "mean_ms": 2.0, "after_load_mb": 1.0, "peak_mb": 1.0, "threads": 1}]

    monkeypatch.setattr(patch_bench, "run_all", fake_run_all)
    monkeypatch.setattr("sys.argv", ["patch_bench.py", "--model", "tiny-gemma3", "--modes", "generate"])
    patch_bench.main()
    out = capsys.readouterr().out.splitlines()
    assert seen["stock"] == "eager"
    assert [line for line in out if "compiled" in line] == [
        f"stock compiled: skipped, torch.compile cannot run on cpu here ({why})"]


def test_ops_per_token_for_stock_and_every_variant():
    """--ops: per token, the stock step's operations and host reads (a compiled row counted as its static cache's
    eager step) and each variant's, split into the with-context step and the rest."""
    args = argparse.Namespace(model="tiny-gemma3", dtype="float32", device="cpu", threads=1, tokens=2,
                              apply="materialized", stock="eager,compiled")
    rows = patch_bench.count_all(args, ["naive", "closed_loop"])
    assert [r["variant"] for r in rows] == ["stock eager", "stock static", "naive", "closed_loop"]
    for r in rows:
        assert r["ops_per_token"] > 0 and r["host_reads_per_token"] >= 0
    for r in rows[2:]:
        assert 0 < r["context_ops"] < r["ops_per_token"]
        assert r["host_reads_per_token"] == 0  # the token stays on the device; the statistics wait for the end


def test_a_shape_is_built_on_the_device_in_its_dtype_and_timed(monkeypatch):
    """`--model gemma3-27b-shape` builds the model straight on the device in the run's dtype (no float32 copy on the
    host: 27B would be 108 GB there). Here the same builder on a tiny Gemma 3 shape, bfloat16 on the CPU: every
    parameter bfloat16 from the start, and the rows run; a shape the memory cannot hold is refused in one line
    before anything is allocated."""
    from experiments.core.errors import UserError
    from experiments.zoo.gemma import tiny_text_config
    from experiments.zoo.tokenizer import byte_tokenizer

    tiny = tiny_text_config(len(byte_tokenizer()))
    monkeypatch.setitem(patch_bench.SHAPES, "tiny-shape", lambda: tiny)
    bundle, _ = patch_bench.load("tiny-shape", "bfloat16", "cpu", 1)
    assert {p.dtype for p in bundle.model.parameters()} == {torch.bfloat16}
    args = argparse.Namespace(model="tiny-shape", dtype="bfloat16", device="cpu", threads=1, tokens=2,
                              apply="materialized")
    rows = patch_bench.one_process(args, ["generate", "patched"], ["naive"])
    assert all("error" not in r and r["ms_per_token"] > 0 for r in rows)
    assert patch_bench.gemma3_27b_config().num_hidden_layers == 62
    monkeypatch.setattr("experiments.zoo.loading.available_bytes", lambda device: 2**30)
    with pytest.raises(UserError, match="27.*B parameters.*1.0 GiB is available"):
        patch_bench.build_shape("gemma3-27b-shape", patch_bench.gemma3_27b_config(), torch.bfloat16, "cpu")
