"""Shared test helpers: run the real `icl-exp` entry point in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


# -- Ctrl-C in a child process ---------------------------------------------------------------------------
def ctrl_c_as_in_a_terminal() -> None:
    """`preexec_fn` for a child that a test sends SIGINT: SIGINT back to its default action, so that Python
    installs its KeyboardInterrupt handler there. A shell starts a background job (`bash .ci/run &`,
    `nohup`) with SIGINT ignored, every process below inherits that, and Python leaves an ignored SIGINT
    ignored: the child would sleep through the test's Ctrl-C (seen: two tests hung until their guards)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


def with_cpu_device(args: tuple[str, ...]) -> list[str]:
    """`icl-exp run NAME ...` gets device=cpu unless it names a device."""
    args = list(args)
    if args[:1] == ["run"] and not any(a.startswith(("device=", "+device=", "++device=")) for a in args):
        args.append("device=cpu")
    return args


def run_cli(*args: str, cwd: Path = REPO_ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """`icl-exp ARGS...` in a fresh interpreter (Hydra keeps global state; a subprocess is a clean slate)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "cli.main", *with_cpu_device(args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def icl():
    return run_cli


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is ~100x faster than two on the CI machine (see zoo/threads.py).
    A module takes it with `pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """The session's smoke runs, one per experiment (tests/smoke_runs.py)."""
    from tests.smoke_runs import SmokeRuns

    return SmokeRuns(tmp_path_factory.mktemp("smoke_runs"))


@pytest.fixture(scope="module")
def smoke_run(request, smoke_runs) -> Path:
    """The shared smoke run of the experiment a test module names in its EXPERIMENT constant."""
    return smoke_runs(request.module.EXPERIMENT)


# -- the registry's trained models ---------------------------------------------------------------------
def setup_extras() -> set[str]:
    """The extras the set-up installs by default (noxfile.py's DEFAULT_EXTRAS, read without importing nox)."""
    import ast

    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_EXTRAS" for t in node.targets):
            return set(ast.literal_eval(node.value).split(","))
    raise AssertionError("noxfile.py has no DEFAULT_EXTRAS")


def require_bundled(name: str) -> None:
    """Skip, in one line naming the extra, when the chunk packages of the bundled model `name` are not
    installed, except in CI (CI=true) for a model of the set-up's default extras, which `nox -s tests`
    installs, so that a skip would hide a broken set-up (an opt-in model, such as the 1.5B, skips there too)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from experiments.zoo.bundled_gguf import BUNDLED

    model = BUNDLED[name]
    try:
        for dist, _ in model.chunks:
            distribution(dist)
    except PackageNotFoundError:
        why = f"model={name} needs its chunk packages: {model.install_hint}"
        if os.environ.get("CI", "").lower() in ("1", "true") and model.extra in setup_extras():
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def qwen32():
    """The real Qwen2.5-Coder-0.5B-Instruct in float32 (model=qwen2.5-0.5b), loaded once for the session: its
    conversion is cached on disk (the first run on a machine joins the chunks and converts, about 2 min on 2
    cores), its load takes seconds. Tests must leave its weights as they found them."""
    import torch

    from experiments.zoo.loading import load_model

    require_bundled("qwen2.5-0.5b")
    return load_model("qwen2.5-0.5b", torch.float32)
