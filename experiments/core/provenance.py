"""What run.json records about where a result came from: git state, package versions, host."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

from experiments.core.registry import REPO_ROOT

PACKAGES = ("icl-exp", "torch", "transformers", "hydra-core", "omegaconf", "numpy", "pandas",
            "matplotlib", "safetensors")


def git_state() -> dict[str, object]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host() -> dict[str, object]:
    """The machine a run's numbers (and its wall time) belong to: results/README.md lists it per run."""
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu": cpu_model(),
            "cores": os.cpu_count()}


def cpu_model() -> str:
    """`AMD EPYC 9R14 96-Core Processor` from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
