"""The set-up: the main job and the tests share one environment, `.venv` (not one nox environment
each: 4.1 GB for two copies of torch), whose bin/ holds `icl-exp`; CI runs the README's test session."""

from __future__ import annotations

import ast

from tests.helpers.repo import REPO_ROOT, import_noxfile


def _sessions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) == "nox.session":
                    out[node.name] = node
    return out


def _backend(node: ast.FunctionDef) -> str | None:
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call):
            for kw in dec.keywords:
                if kw.arg == "venv_backend":
                    return ast.literal_eval(kw.value)
    return None


def test_main_job_and_tests_share_dot_venv():
    sessions = _sessions()
    for name in ("tests", "linreg_icl", "dev"):
        node = sessions[name]
        assert _backend(node) == "none", f"{name} would get its own nox environment"
        calls = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
        assert "install" in calls, f"{name} does not set up the shared .venv"
    source = (REPO_ROOT / "noxfile.py").read_text()
    assert 'VENV = Path(__file__).resolve().parent / ".venv"' in source
    assert "source .venv/bin/activate" in source  # every session ends saying how to get icl-exp on the PATH


def test_cpu_torch_never_cuda_wheels_without_a_gpu():
    source = (REPO_ROOT / "noxfile.py").read_text()
    assert 'TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"' in source
    assert 'shutil.which("nvidia-smi")' in source


def test_ci_runs_the_readme_test_session():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    readme = (REPO_ROOT / "README.md").read_text()
    assert "nox -s lint tests" in ci and "python3 -m nox -s lint tests" in readme


# -- install_torch, run with a stand-in for nox and for the .venv (nothing is installed) -------------------

class _Refused(Exception):
    pass


class _FakeEnv:
    """A .venv that has torch or not, whose torch sees CUDA or not; records the pip calls."""

    def __init__(self, has_torch: bool, cuda: bool, build: str = "2.13.0+cpu no CUDA"):
        self.has_torch, self.cuda, self.build = has_torch, cuda, build
        self.python = "/x/.venv/bin/python"
        self.pips: list[tuple[str, ...]] = []
        self.session = self

    def error(self, message):
        raise _Refused(message)

    def has(self, code: str) -> bool:
        return self.cuda if "cuda.is_available" in code else self.has_torch

    def pip(self, *args: str) -> None:
        self.pips.append(args)
        self.has_torch = True

    def output(self, *args: str) -> str:
        return self.build


def _machine(monkeypatch, nox_module, gpu: bool, local_wheel: bool = False, driver: str = "12.4"):
    monkeypatch.setattr(nox_module.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if gpu else None)
    monkeypatch.setattr(nox_module, "_local_wheel_available", lambda env, req: local_wheel)
    monkeypatch.setattr(nox_module, "_driver_cuda", lambda: driver)


def test_cpu_torch_comes_alone_from_the_cpu_index_and_the_rest_from_the_users_index(monkeypatch):
    nf = import_noxfile(monkeypatch)
    _machine(monkeypatch, nf, gpu=False)
    env = _FakeEnv(has_torch=False, cuda=False)
    nf.install_torch(env)
    pin = f"torch=={nf.TORCH_VERSION}"
    assert env.pips == [(pin, "--no-deps", "--index-url", nf.TORCH_CPU_INDEX), (pin,)]
    # no registry hard-coded: pip.conf / PIP_INDEX_URL decide where everything but torch comes from
    assert "pypi.org" not in (REPO_ROOT / "noxfile.py").read_text()


def test_a_gpu_machine_refuses_a_torch_that_cannot_use_the_gpu_with_the_fix_in_one_line(monkeypatch):
    nf = import_noxfile(monkeypatch)
    _machine(monkeypatch, nf, gpu=True)
    env = _FakeEnv(has_torch=True, cuda=False)  # a +cpu torch kept in .venv from before
    try:
        nf.install_torch(env)
    except _Refused as err:
        line = str(err)
    else:
        raise AssertionError("a CPU torch on a GPU machine was accepted")
    assert "\n" not in line and "2.13.0+cpu" in line and "CUDA 12.4" in line
    assert line.endswith(f"pip install --force-reinstall --no-deps torch=={nf.TORCH_VERSION} "
                         f"--index-url https://download.pytorch.org/whl/cu124")


def test_a_gpu_machine_with_a_working_cuda_torch_installs_the_default_build_and_passes(monkeypatch):
    nf = import_noxfile(monkeypatch)
    _machine(monkeypatch, nf, gpu=True)
    env = _FakeEnv(has_torch=False, cuda=True)
    nf.install_torch(env)
    assert env.pips == [(f"torch=={nf.TORCH_VERSION}",)]  # from the configured index: its CUDA build
