"""The packages a GPU box may lack, carried as wheels in the git-ignored `.whl/` (filled by `nox -s
gpu_wheels` where a registry is reached) and unpacked there onto PYTHONPATH: pure-Python wheels are zip
files laid out as site-packages, so no pip and no registry is needed to use them."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

# Downloaded as wheels (all pure Python); the versions the project's pyproject.toml allows
DOWNLOAD = ("hydra-core>=1.3.2,<1.4", "omegaconf>=2.3,<2.4", "hydra-joblib-launcher>=1.2",
            "hydra-submitit-launcher>=1.2", "submitit>=1.5", "cloudpickle>=2")  # cloudpickle: submitit's
# Not carried: lingua-language-detector (system_compile's `language:` checks, a 96 MB wheel, over what a GPU box is
# sent); it is imported only by such a check, and the check's smoke run asks `starts_with:` alone.
# omegaconf 2.3 needs exactly this one, and the registry has only its source: a wheel is built from it
BUILD = ("antlr4-python3-runtime==4.9.3",)
# what must import on the box before any step runs (the module each wheel provides)
NEEDED = ("hydra", "omegaconf", "antlr4", "hydra_plugins.hydra_joblib_launcher")


def unpack(wheel_dir: Path, target: Path) -> list[str]:
    """Every wheel of `wheel_dir` extracted into `target` (a PYTHONPATH entry); their names."""
    target.mkdir(parents=True, exist_ok=True)
    names = []
    for wheel in sorted(Path(wheel_dir).glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        names.append(wheel.name)
    return names


def missing(python: str, env: dict[str, str]) -> list[str]:
    """The NEEDED modules that `python` cannot import with `env` (its PYTHONPATH)."""
    code = ("import importlib.util as u, sys\n"
            f"print(' '.join(m for m in {NEEDED!r} if u.find_spec(m) is None))")
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return out.stdout.split() if out.returncode == 0 else list(NEEDED)
