"""Where prepared data lives: `cache_dir=` if given, else $ICL_EXP_CACHE, else $XDG_CACHE_HOME/icl-exp
(~/.cache/icl-exp). Prepared once, reused by every run and every variant."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: str | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("ICL_EXP_CACHE"):
        return Path(os.environ["ICL_EXP_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "icl-exp"
