"""Debian packages a test session needs (SLURM for the cluster tests, Chromium for the report's browser
test), installed with apt-get as root when absent: one way to install, one way to say why it could not."""

from __future__ import annotations

import os
import subprocess
import time


class Unavailable(Exception):
    """What a test needs is not here and cannot be installed here; the message says why, in one line."""


def apt_install(packages: list[str] | tuple[str, ...], log=print, why: str = "") -> float:
    """`apt-get update` then `apt-get install -y PACKAGES` (noninteractive); the seconds it took. A failed
    command raises Unavailable with its last line of stderr."""
    t0 = time.perf_counter()
    log(f"installing {' '.join(packages)} with apt-get{f' ({why})' if why else ''}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"`{' '.join(cmd)}` failed: {last}")
    return time.perf_counter() - t0
