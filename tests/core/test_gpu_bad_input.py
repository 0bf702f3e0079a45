"""Bad input on a GPU box, through the real `icl-exp run` with one GPU faked in its process (a sitecustomize
first on PYTHONPATH): each is one line, exit 2, no run folder; the float64 rate is a warning, said once.
The card's memory and capability come from torch.cuda.get_device_properties, which needs no CUDA context;
reading the free memory (mem_get_info) would create one, so the fake refuses it: the CLI must not.
torchrun with more ranks than GPUs: tests/core/test_device_guards.py."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.repo import REPO_ROOT

FAKE = textwrap.dedent("""
    import os
    from types import SimpleNamespace

    import torch

    def _props(device=None):
        major, minor = os.environ["FAKE_CC"].split(".")
        return SimpleNamespace(name=os.environ["FAKE_NAME"], total_memory=int(os.environ["FAKE_TOTAL"]),
                               major=int(major), minor=int(minor))

    def _context(device=None):
        if "FAKE_FREE" in os.environ:  # a plain run's own GPU: reading it is allowed
            return int(os.environ["FAKE_FREE"]), int(os.environ["FAKE_TOTAL"])
        raise AssertionError("the CLI read a GPU's free memory: that creates a CUDA context")

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = _props
    torch.cuda.get_device_name = lambda device=None: _props().name
    torch.cuda.mem_get_info = _context
""")


def icl_on_fake_gpu(tmp_path, *args, card="NVIDIA H100 80GB HBM3", cc="9.0", total=80 << 30, env=None):
    (tmp_path / "inject").mkdir(exist_ok=True)
    (tmp_path / "inject" / "sitecustomize.py").write_text(FAKE)
    environ = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), str(REPO_ROOT)]),
               "FAKE_NAME": card, "FAKE_CC": cc, "FAKE_TOTAL": str(total), **(env or {})}
    return run_cli("run", *args, env=environ, timeout=300, cpu=False)  # device=auto sees the fake


def one_line_refusal(proc, run_dir, *needles) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not run_dir.exists()


def test_a_gpu_past_the_card_count_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = icl_on_fake_gpu(tmp_path, "linreg_icl", "preset=smoke", "device=cuda:1", f"hydra.run.dir={run_dir}")
    one_line_refusal(proc, run_dir, "device=cuda:1", "1 GPU here (cuda:0)")


def test_a_model_larger_than_the_card_is_refused_in_a_sweep_without_a_cuda_context(tmp_path):
    """A sweep's model check on CUDA: against the card's memory (no context); a read of the free memory
    would have raised in the fake, as it created a context on GPU 0 for every job and torchrun rank."""
    sweep_dir = tmp_path / "sweep"
    proc = icl_on_fake_gpu(tmp_path, "patch_match", "-m", "preset=smoke", "model=tiny-llama", "device=cuda",
                           "seed=0,1", f"hydra.sweep.dir={sweep_dir}", total=1 << 10)
    one_line_refusal(proc, sweep_dir, "model 'tiny-llama'", "on cuda", "use a smaller model")


def test_a_plain_run_is_refused_for_its_gpus_free_memory(tmp_path):
    """A plain run runs in the CLI's process on that GPU: its check reads the free memory there (the
    context is the run's own), so a model larger than what is free is one line, before any folder."""
    run_dir = tmp_path / "run"
    proc = icl_on_fake_gpu(tmp_path, "patch_match", "preset=smoke", "model=tiny-llama", "device=cuda",
                           f"hydra.run.dir={run_dir}", env={"FAKE_FREE": str(1 << 10)})
    one_line_refusal(proc, run_dir, "model 'tiny-llama'", "on cuda", "use a smaller model")


def test_float64_on_a_card_with_slow_float64_warns_once(tmp_path):
    """layer_errors runs float32 and float64: on an RTX 4090 (1/64) one warning for a sweep's two jobs on the
    card; on an H100 (1/2) none. The sweep stops right after the CLI's checks of its jobs, at its output folder,
    which cannot be made (a file stands where its parent would be): `--cfg job` runs no job check (it prints
    what composition gives, importing no torch). A plain run warns from the same function, in its job."""
    free = {"FAKE_FREE": str(24 << 30)}
    (tmp_path / "a_file").write_text("")
    stop = f"hydra.sweep.dir={tmp_path / 'a_file' / 'run'}"
    proc = icl_on_fake_gpu(tmp_path, "layer_errors", "preset=smoke", "device=cuda", "seed=0,1", "-m", stop,
                           card="NVIDIA GeForce RTX 4090", cc="8.9", env=free)
    assert proc.returncode == 2 and "cannot write the output folder" in proc.stderr, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "1/64" in warnings[0] and "64x longer" in warnings[0], proc.stderr[-3000:]
    assert "layer_errors" in warnings[0] and "RTX 4090" in warnings[0]
    proc = icl_on_fake_gpu(tmp_path, "layer_errors", "preset=smoke", "device=cuda", "seed=0,1", "-m", stop, env=free)
    assert proc.returncode == 2 and "warning:" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("value, needles", [("true", ("train.compile=true", "a C compiler", "train.compile=auto")),
                                            ("maybe", ("train.compile=maybe must be true, false or auto",))])
def test_compile_true_without_a_c_compiler_is_one_line(tmp_path, value, needles):
    run_dir = tmp_path / "run"
    env = {"PATH": str(tmp_path / "no-compilers"), "CC": "", "CXX": ""}  # no gcc, no clang
    proc = run_cli("run", "gpt_wq", "preset=smoke", "device=cpu", f"train.compile={value}",
                   f"hydra.run.dir={run_dir}", env=env, timeout=300)
    one_line_refusal(proc, run_dir, *needles)


def test_compile_auto_falls_back_where_triton_is_missing(monkeypatch):
    """compile=auto on CUDA without Triton: eager training and a note; on the CPU with a compiler: compiled."""
    import importlib.util

    from experiments.core import gpu_rates
    from experiments.karbevski.gpt_wq.run import compile_setting

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(gpu_rates, "c_compiler", lambda: "gcc")
    use, why = compile_setting("auto", "cuda")
    assert not use and "Triton" in why
    assert compile_setting("auto", "cpu") == (True, None)
    assert compile_setting(True, "cuda") == (True, None) and compile_setting(False, "cpu") == (False, None)
