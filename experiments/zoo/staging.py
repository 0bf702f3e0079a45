"""Writes into the model cache that are all or nothing: a temporary sibling of the target, renamed onto it
when complete and removed when anything fails. An unwritable or full cache becomes one line."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from experiments.core.atomic import _umask
from experiments.core.errors import UserError
from experiments.data.cache import cache_root


def models_dir() -> Path:
    return cache_root() / "models"


class staging:
    """A temporary sibling of `target` (file or folder), renamed onto it when the block succeeds and
    removed when it fails. An unwritable or full cache becomes one line; nothing half-written stays."""

    def __init__(self, target: Path, is_dir: bool = False):
        self.target, self.is_dir = Path(target), is_dir

    def __enter__(self) -> Path:
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            if self.is_dir:
                self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
                os.chmod(self.tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the cache from colleagues
            else:
                fd, tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=self.target.parent)
                os.close(fd)
                self.tmp = Path(tmp)
        except OSError as err:
            raise cache_error(self.target, err) from None
        return self.tmp

    def __exit__(self, kind, err, tb) -> bool:
        if kind is None:
            try:
                if self.is_dir:
                    self.tmp.rename(self.target)
                else:
                    os.chmod(self.tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide it from colleagues
                    os.replace(self.tmp, self.target)
                return False
            except OSError as rename_err:
                if not self.target.exists():  # (a concurrent run that got there first is fine)
                    self._remove()
                    raise cache_error(self.target, rename_err) from None
        self._remove()
        if kind is not None and issubclass(kind, OSError):  # ENOSPC, EROFS, EACCES while writing
            raise cache_error(self.target, err) from None
        return False

    def _remove(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True) if self.is_dir else self.tmp.unlink(missing_ok=True)


def cache_error(target: Path, err: OSError) -> UserError:
    return UserError(f"cannot write the model cache {target.parent}: {err.strerror or err}; nothing was cached; "
                     "set ICL_EXP_CACHE=DIR to a writable folder with about 2 GB free")
