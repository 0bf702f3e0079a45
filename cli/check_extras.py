"""What an override needs installed: a launcher's plugin, a tracker's package; named with the extra that
installs it, in one line, before any job starts (Hydra's own answer is "Could not load ...")."""

from __future__ import annotations

from hydra.core.override_parser.types import Override

from cli.compose import override_values
from experiments.core.errors import UserError

# hydra/launcher=OPTION -> (the plugin module it needs, the extra that installs it, the package)
LAUNCHER_EXTRAS = {
    "parallel": ("hydra_plugins.hydra_joblib_launcher", "joblib", "hydra-joblib-launcher"),
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "joblib", "hydra-joblib-launcher"),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
}


def plugin_installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # hydra_plugins itself missing
        return False


def check_launcher(parsed: list[Override]) -> None:
    """`hydra/launcher=parallel` without the joblib extra: Hydra says "Could not load
    'hydra/launcher/joblib'"; name the extra that installs it instead."""
    for o in parsed:
        if o.key_or_group != "hydra/launcher" or o.is_delete():
            continue
        for value in override_values(o) or []:
            if value in LAUNCHER_EXTRAS and not plugin_installed(LAUNCHER_EXTRAS[value][0]):
                _, extra, package = LAUNCHER_EXTRAS[value]
                raise UserError(f"hydra/launcher={value} needs the {extra} extra, which is not installed: "
                                f"pip install -e '.[{extra}]' (installs {package})")


def check_logger(parsed: list[Override]) -> None:
    """`logger=mlflow` without its package: the extra that installs it, in one line, before any run."""
    from experiments.core.trackers import EXTRAS

    for o in parsed:
        if o.key_or_group != "logger" or o.is_delete():
            continue
        for value in override_values(o) or []:
            if value in EXTRAS and not plugin_installed(EXTRAS[value][0]):
                raise UserError(f"logger={value} needs the {EXTRAS[value][1]} extra, which is not installed: "
                                f"pip install -e '.[{EXTRAS[value][1]}]'")
