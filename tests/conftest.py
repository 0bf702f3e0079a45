"""The suite's fixtures and hooks. The helpers that test files import live in tests/helpers/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.bundled import require_bundled
from tests.helpers.cli import cli_in_process, run_cli


# -- CPU by default --------------------------------------------------------------------------------------
# The tolerances here (1e-5 DDP against one process, 1e-6 resume, float32 "exact") were set on CPU in float32;
# on a GPU box `device=auto` would run the tests on CUDA with bf16 autocast, and the DDP test's rank 1 would
# ask for cuda:1 on a one-GPU machine. So the suite runs on CPU wherever it is: CUDA is hidden from this
# process and every process it starts (torchrun ranks and SLURM jobs included), and `run_cli` passes
# device=cpu to `icl-exp run`. Tests that need CUDA are marked `gpu` and run with `pytest -m gpu`, which
# leaves CUDA visible; where there is no CUDA they are skipped, one line each.
def _gpu_tests_selected(markexpr: str) -> bool:
    return "gpu" in markexpr and "not gpu" not in markexpr


def pytest_configure(config):
    if not _gpu_tests_selected(config.getoption("markexpr") or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        why = ("needs CUDA; run with -m gpu on a GPU machine" if os.environ.get("CUDA_VISIBLE_DEVICES") == ""
               else "needs CUDA; none here")
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def icl():
    """`icl-exp ARGS` in a subprocess (tests/helpers/cli.py's run_cli)."""
    return run_cli


@pytest.fixture
def icl_inprocess():
    """`icl-exp ARGS` in this process: fast, for the errors raised before Hydra starts a run."""
    return cli_in_process()


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is far faster than two on a small machine (see zoo/threads.py).
    A module takes it with `pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """The session's smoke runs, one per experiment (tests/helpers/smoke_runs.py)."""
    from tests.helpers.smoke_runs import SmokeRuns

    return SmokeRuns(tmp_path_factory.mktemp("smoke_runs"))


@pytest.fixture(scope="module")
def smoke_run(request, smoke_runs) -> Path:
    """The shared smoke run of the experiment a test module names in its EXPERIMENT constant."""
    return smoke_runs(request.module.EXPERIMENT)


# -- the registry's trained models ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def qwen32():
    """The real Qwen2.5-Coder-0.5B-Instruct in float32 (model=qwen2.5-0.5b), loaded once for the session: its
    conversion is cached on disk (the first run on a machine joins the chunks and converts, about 2 min on 2
    cores), its load takes seconds. Tests must leave its weights as they found them."""
    import torch

    from experiments.patching.load import load_checked

    require_bundled("qwen2.5-0.5b")
    return load_checked("qwen2.5-0.5b", torch.float32)
