"""A sweep job made to fail on purpose, for the tests of what a sweep does with a failed job."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.helpers.repo import REPO_ROOT


def user_error_for_seed(tmp_path: Path, seed: int) -> dict:
    """A job that raises UserError at run time (after its run folder exists), in this process and in
    joblib's worker processes alike: a sitecustomize on PYTHONPATH wraps seed_everything. Returns the
    environment the CLI needs for it."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import experiments.core.runtime as runtime
        from experiments.core.errors import UserError

        _seed_everything = runtime.seed_everything

        def seed_everything(seed):
            if seed == {seed}:
                raise UserError("deliberate failure for seed {seed}")
            return _seed_everything(seed)

        runtime.seed_everything = seed_everything
    """))
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), str(REPO_ROOT)])}
