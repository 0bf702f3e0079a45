"""Hydra instantiates launchers only from the `hydra_plugins` namespace package, so the project's SLURM
launcher (experiments/core/slurm_launcher.py) is registered here under that name; conf/hydra/launcher/
slurm.yaml points at it. No `hydra_plugins/__init__.py`: the namespace is shared with installed plugins."""

from experiments.core.slurm_launcher import SlurmLauncher as _SlurmLauncher


class SlurmLauncher(_SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher with resources from the experiment, a one-line sbatch
    refusal and a squeue-based wait (see experiments/core/slurm_launcher.py)."""
