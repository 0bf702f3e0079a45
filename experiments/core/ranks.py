"""Who this process is under torchrun (RANK / LOCAL_RANK / WORLD_SIZE), read from the environment alone: what
the CLI asks before it imports torch (a plain run's command line is answered before torch is loaded). The
collective steps are in distributed.py."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def info() -> DistInfo:
    env = os.environ
    return DistInfo(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


def is_main_process() -> bool:
    return info().is_main


def hydra_overrides_for_rank() -> list[str]:
    """Ranks other than 0 write no .hydra/ folder and no log file into the shared run folder."""
    if info().is_main:
        return []
    # The console handler stays (conf/config.yaml gives it the project's formatter, which a disabled
    # job_logging would leave without a class); the log-file handler is kept off the root logger and
    # opens its file lazily, so it never touches the shared folder.
    return ["hydra.output_subdir=null", "hydra.job_logging.root.handlers=[console]",
            "++hydra.job_logging.handlers.file.delay=true", "hydra/hydra_logging=disabled"]
