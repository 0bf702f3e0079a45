"""Atomic file writes: write a temp file in the same folder, then rename over the target.

A reader (or `icl-exp plot`) never sees a half-written CSV, JSON or figure, even if the
process dies mid-write.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` and then rename tmp_path onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        # mkstemp makes the temp file 0600; the result should be readable as any file the user
        # writes (colleagues on a shared box read the results), so give it the umask's mode.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def save_pretrained(obj: Any, folder: Path, **kwargs: Any) -> None:
    """`obj.save_pretrained(folder, **kwargs)` (a transformers model or tokenizer), its files given the
    umask's mode: transformers writes model.safetensors through a 0600 temp file, as mkstemp does."""
    folder = Path(folder)
    obj.save_pretrained(folder, **kwargs)
    mode = 0o666 & ~_umask()
    for path in folder.rglob("*"):
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600 and mode != 0o600:
            os.chmod(path, mode)
