"""The set-up: the main job and the tests share one environment, `.venv` (not one nox environment
each: 4.1 GB for two copies of torch), whose bin/ holds `icl-exp`; CI runs the README's test session."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT


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
    assert "nox -s lint tests" in ci
