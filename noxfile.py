"""Set up and run icl-exp in a fresh virtual environment.

    nox -s linreg_icl   # set up, then reproduce Dherin et al. Fig. 2 (offline, CPU, minutes)
    nox -s tests        # set up, then the test suite (what CI runs)
    nox -s lint         # ruff
    nox -s smoke        # every registered experiment at preset=smoke through the CLI
    nox -s report_browser  # two experiments, the report, and a headless-Chromium screenshot of it

On a machine without an NVIDIA GPU the set-up installs the CPU build of torch first, so pip never
downloads CUDA wheels; with a GPU it installs the default (CUDA) build.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]

TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_torch(session: nox.Session) -> None:
    if shutil.which("nvidia-smi"):
        session.install(f"torch=={TORCH_VERSION}")
        return
    # CPU build. A CPU wheel already on this machine (pip's find-links) is taken as is: its
    # "+cpu" local version sorts above the registry's CUDA build. Otherwise PyTorch's CPU-only
    # index serves it (and PyPI the rest).
    if _local_wheel_available(session, f"torch=={TORCH_VERSION}"):
        session.install(f"torch=={TORCH_VERSION}")
    else:
        session.install(f"torch=={TORCH_VERSION}", "--index-url", TORCH_CPU_INDEX,
                        "--extra-index-url", "https://pypi.org/simple")


def _local_wheel_available(session: nox.Session, requirement: str) -> bool:
    """Can pip find `requirement` without any index (find-links only)?"""
    try:
        session.run("python", "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--no-index",
                    requirement, silent=True)
    except nox.command.CommandFailed:
        return False
    return True


def install(session: nox.Session, extras: str = "test,joblib") -> None:
    install_torch(session)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (CI): unit tests, every experiment end to end at preset=smoke, the CLI's errors."""
    install(session)
    session.run("python", "-m", "pytest", "-q", "-ra", *session.posargs)


@nox.session
def linreg_icl(session: nox.Session) -> None:
    """The main job: Dherin et al. Fig. 2 at the paper's settings, offline on CPU."""
    install(session)
    session.run("icl-exp", "run", "linreg_icl", *session.posargs)


@nox.session
def smoke(session: nox.Session) -> None:
    """Every registered experiment at preset=smoke through the real CLI."""
    install(session)
    names = session.run("python", "-c",
                        "from experiments.core.registry import experiment_names as n; print(' '.join(n()))",
                        silent=True).split()
    for name in names:
        session.run("icl-exp", "run", name, "preset=smoke", "device=cpu", *session.posargs)


@nox.session
def report_browser(session: nox.Session) -> None:
    """Reproduce two experiments at preset=smoke, write the report, and screenshot report.html in headless
    Chromium (installed with apt-get when missing and possible): the page a reader opens, checked by eye."""
    install(session)
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        if shutil.which("apt-get") and os.geteuid() == 0:
            session.run("apt-get", "install", "-y", "chromium", external=True)
        else:
            session.skip("no Chromium: apt-get install chromium")
    out = Path(session.create_tmp()) / "report_browser"
    session.run("icl-exp", "reproduce", "preset=smoke", "--only", "linreg_icl,factorization", "--results",
                str(out / "results"), *session.posargs)
    session.run("python", "-c", "import sys; from experiments.core.report import screenshot_html as s; "
                "print(s(sys.argv[1], sys.argv[2]))", str(out / "results" / "report.html"), str(out / "report.png"))
    session.log(f"look at {out / 'report.png'} (and open {out / 'results' / 'report.html'})")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
