"""One local SLURM cluster per test session (tests/cluster/local_slurm.py): installed with apt-get when
absent, started once, stopped by its pids at the end. Skipped, in one line, only where this machine
cannot run the daemons (not root, not Linux, no SLURM and no apt-get, apt-get failing)."""

from __future__ import annotations

import pytest

from tests.cluster.local_slurm import LocalSlurm, Unavailable, ensure_installed


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm extra: pip install -e '.[slurm]'")
    try:
        ensure_installed()
    except Unavailable as why:
        pytest.skip(f"no local SLURM cluster: {why}")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
