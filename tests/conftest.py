"""Shared test helpers: run the real `icl-exp` entry point in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = REPO_ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """`icl-exp ARGS...` in a fresh interpreter (Hydra keeps global state; a subprocess is a clean slate)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def icl():
    return run_cli
