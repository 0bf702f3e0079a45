"""Hydra's own command-line flags (`icl-exp run NAME --cfg job`), said once: which there are, which take the
word after them, and which print or inspect one config instead of running. Any other `--word` after a run
is a mistake (check_overrides.py says which override it meant); launch.py hands these to Hydra after the overrides,
where its parser expects them."""

from __future__ import annotations

TAKES_VALUE = frozenset({"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
                         "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"})
FLAGS = TAKES_VALUE | {"--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r", "--multirun", "-m",
                       "--shell-completion", "-sc"}
ONE_CONFIG = frozenset({"--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"})  # not with -m


def hydra_flags(args: list[str]) -> list[str]:
    """Hydra's own flags in `args`, with the word that follows those taking one (`--cfg job`)."""
    flags: list[str] = []
    i = 0
    while i < len(args):
        if args[i].startswith("-"):
            flags.append(args[i])
            if args[i] in TAKES_VALUE and i + 1 < len(args) and "=" not in args[i + 1]:
                flags.append(args[i + 1])
                i += 1
        i += 1
    return flags
