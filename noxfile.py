"""Set up and run icl-exp in one virtual environment, `.venv` in the repository, shared by every
session below (one torch install, not one per session), so that afterwards
`source .venv/bin/activate` puts `icl-exp` on the PATH.

    nox -s linreg_icl   # set up, then reproduce Dherin et al. Fig. 2 at the paper's settings (offline, CPU:
                        # 85 s on a 2-core machine at load 3, 6 min at load 10; `-- preset=cpu` about half)
    nox -s tests        # set up, then the test suite (what CI runs)
    nox -s dev          # only set up
    nox -s lint         # ruff (its own small environment)
    nox -s smoke        # every registered experiment at preset=smoke through the CLI
    nox -s report_browser  # two experiments, the report, and a headless-Chromium screenshot of it

On a machine without an NVIDIA GPU the set-up installs the CPU build of torch first, so pip never
downloads CUDA wheels; with a GPU it installs the default (CUDA) build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]

TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VENV = Path(__file__).resolve().parent / ".venv"  # the one environment: main job, tests, `icl-exp` by hand
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
ACTIVATE = "source .venv/bin/activate" if os.name != "nt" else r".venv\Scripts\activate"


class SharedEnv:
    """`.venv`, made once (virtualenv, which comes with nox) and brought up to date by each session.
    Sessions using it are declared with venv_backend="none": nox makes no environment of its own."""

    def __init__(self, session: nox.Session):
        self.session = session
        self.python = str(BIN / "python")

    def create(self) -> None:
        if not (BIN / "python").exists():
            self.session.run(sys.executable, "-m", "virtualenv", "--quiet", str(VENV), external=True)

    def pip(self, *args: str) -> None:
        self.session.run(self.python, "-m", "pip", "install", "--quiet", *args, external=True)

    def has(self, code: str) -> bool:
        return subprocess.run([self.python, "-c", code], capture_output=True).returncode == 0

    def run(self, program: str, *args: str) -> None:
        """`program` (python, icl-exp, ...) from .venv, with .venv first on the PATH."""
        env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(VENV)}
        self.session.run(str(BIN / program), *args, external=True, env=env)

    def output(self, *args: str) -> str:
        return subprocess.run([self.python, *args], capture_output=True, text=True, check=True).stdout


def install_torch(env: SharedEnv) -> None:
    if env.has(f"import torch, sys; sys.exit(torch.__version__.split('+')[0] != '{TORCH_VERSION}')"):
        return  # already there (a re-run, or another session set it up)
    if shutil.which("nvidia-smi"):
        env.pip(f"torch=={TORCH_VERSION}")
        return
    # CPU build. A CPU wheel already on this machine (pip's find-links) is taken as is: its
    # "+cpu" local version sorts above the registry's CUDA build. Otherwise PyTorch's CPU-only
    # index serves it (and PyPI the rest).
    if _local_wheel_available(env, f"torch=={TORCH_VERSION}"):
        env.pip(f"torch=={TORCH_VERSION}")
    else:
        env.pip(f"torch=={TORCH_VERSION}", "--index-url", TORCH_CPU_INDEX, "--extra-index-url", "https://pypi.org/simple")


def _local_wheel_available(env: SharedEnv, requirement: str) -> bool:
    """Can pip find `requirement` without any index (find-links only)?"""
    return subprocess.run([env.python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--no-index",
                           requirement], capture_output=True).returncode == 0


def install(session: nox.Session, extras: str = "test,joblib") -> SharedEnv:
    env = SharedEnv(session)
    env.create()
    install_torch(env)
    env.pip("-e", f".[{extras}]")
    return env


def _say_activate(session: nox.Session) -> None:
    session.log(f"icl-exp is installed in .venv; `{ACTIVATE}` puts it on the PATH")


@nox.session(venv_backend="none")
def dev(session: nox.Session) -> None:
    """Only set up .venv (CPU torch on a machine without an NVIDIA GPU, the package, test tools)."""
    install(session)
    _say_activate(session)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (CI): unit tests, every experiment end to end at preset=smoke, the CLI's errors."""
    env = install(session)
    env.run("python", "-m", "pytest", "-q", "-ra", *session.posargs)
    _say_activate(session)


@nox.session(venv_backend="none")
def linreg_icl(session: nox.Session) -> None:
    """The main job: Dherin et al. Fig. 2 at the paper's settings, offline on CPU, in minutes (training
    computes only the query token's output, one thread); `nox -s linreg_icl -- preset=cpu` is faster still."""
    env = install(session)
    env.run("icl-exp", "run", "linreg_icl", *session.posargs)
    _say_activate(session)


@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """Every registered experiment at preset=smoke through the real CLI."""
    env = install(session)
    names = env.output("-c", "from experiments.core.registry import experiment_names as n; print(*n())").split()
    for name in names:
        env.run("icl-exp", "run", name, "preset=smoke", "device=cpu", *session.posargs)


@nox.session(venv_backend="none")
def report_browser(session: nox.Session) -> None:
    """Reproduce two experiments at preset=smoke, write the report, and screenshot report.html in headless
    Chromium (installed with apt-get when missing and possible): the page a reader opens, checked by eye."""
    env = install(session)
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        if shutil.which("apt-get") and os.geteuid() == 0:
            session.run("apt-get", "install", "-y", "chromium", external=True)
        else:
            session.skip("no Chromium: apt-get install chromium")
    out = Path(session.create_tmp()) / "report_browser"
    env.run("icl-exp", "reproduce", "preset=smoke", "--only", "linreg_icl,factorization", "--results",
            str(out / "results"), *session.posargs)
    env.run("python", "-c", "import sys; from experiments.core.report import screenshot_html as s; "
            "print(s(sys.argv[1], sys.argv[2]))", str(out / "results" / "report.html"), str(out / "report.png"))
    session.log(f"look at {out / 'report.png'} (and open {out / 'results' / 'report.html'})")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
