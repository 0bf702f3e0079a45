"""The repository the tests run against, and its set-up (noxfile.py) read as a test sees it."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def setup_extras() -> set[str]:
    """The extras the set-up installs by default (noxfile.py's DEFAULT_EXTRAS, read without importing nox)."""
    import ast

    tree = ast.parse((REPO_ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DEFAULT_EXTRAS" for t in node.targets):
            return set(ast.literal_eval(node.value).split(","))
    raise AssertionError("noxfile.py has no DEFAULT_EXTRAS")


def import_noxfile(monkeypatch):
    """noxfile.py imported with a stub `nox` (nox itself lives outside .venv)."""
    import importlib.util
    import sys
    import types

    stub = types.ModuleType("nox")
    stub.options = types.SimpleNamespace()
    stub.Session = object
    stub.session = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    monkeypatch.setitem(sys.modules, "nox", stub)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", REPO_ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
