"""Is there a CUDA device for `python`'s torch? Asked in a child process: nox's own interpreter may have
no torch, and importing torch here would make a CUDA context in the caller."""

from __future__ import annotations

import subprocess

PROBE = ("import torch\n"
         "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
         "print(n, torch.__version__, torch.version.cuda or 'no CUDA build')")


def no_cuda_line(python: str, env: dict[str, str] | None = None) -> str | None:
    """None where `python`'s torch sees a CUDA device; else the one line that says why the check stops."""
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no CUDA device: {python} could not be asked ({type(err).__name__})"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"no CUDA device: {python} cannot import torch ({last})"
    count, version, build = out.stdout.split(maxsplit=2)
    if int(count) == 0:
        return (f"no CUDA device: torch {version} ({build.strip()}) of {python} sees none "
                "(torch.cuda.is_available() is False); the GPU check runs on a GPU box")
    return None
