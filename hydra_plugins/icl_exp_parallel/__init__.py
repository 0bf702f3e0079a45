"""Hydra instantiates launchers only from the `hydra_plugins` namespace package, so the project's local
parallel launcher (experiments/core/parallel_launcher.py: one job per GPU on a GPU box) is registered here
under that name, with its config node; conf/hydra/launcher/parallel.yaml builds on both. Hydra imports
every module here at start-up: without the joblib extra this defines nothing (and warns nothing), and the
CLI names the extra when hydra/launcher=parallel is asked for (cli/overrides.py)."""

try:
    from experiments.core.parallel_launcher import ParallelLauncher as _ParallelLauncher
    from experiments.core.parallel_launcher import register_config
except ImportError:  # hydra-joblib-launcher is not installed
    pass
else:
    register_config()

    class ParallelLauncher(_ParallelLauncher):
        """hydra-joblib-launcher's launcher, CUDA jobs one per GPU (see experiments/core/parallel_launcher.py)."""
