"""The experiments' config classes and presets stored in Hydra's ConfigStore, where conf/config.yaml's defaults
find them: what stands in for a yaml file per experiment and per preset, which would hold no value the home does
not. Its own module because it reads the registry (each experiment's home) and the registry reads the config
schema: kept apart, neither imports the other."""

from __future__ import annotations

# The ConfigStore groups an experiment fills (register_schemas): its config class is the option
# `experiment=NAME` itself (package _global_, so its keys are top-level), and each preset that changes something
# is `preset_for=NAME/PRESET`, which conf/config.yaml selects as `optional preset_for: ${experiment}/${preset}`.
# No yaml stands for either: such a file would hold no value the class does not.
GROUP = "experiment"
PRESET_GROUP = "preset_for"


def register_schemas(*names: str) -> None:
    """Store the configs of the experiments `names` (every experiment's when none is named) in Hydra's
    ConfigStore, each once: its class as the option `experiment=NAME`, its presets as `preset_for=NAME/PRESET`.
    Every composition calls this, and a command line composes one experiment: its answer imports that
    experiment's home alone (torch-free) and stores its config (storing converts it, about 0.005 s), not all
    twenty. A name with no home stores nothing (check_schema_registered then says so)."""
    from hydra.core.config_store import ConfigStore

    from experiments.core import registry
    from experiments.core.papers import experiment_module

    store = ConfigStore.instance()
    stored = set(store.list(GROUP)) if GROUP in store.repo else set()
    for name in names or registry.experiment_names():
        if f"{name}.yaml" in stored or experiment_module(name) is None:
            continue
        exp = registry.get(name)
        store.store(group=GROUP, name=name, node=exp.schema, package="_global_")
        for preset, values in exp.presets.items():
            store.store(group=f"{PRESET_GROUP}/{name}", name=preset, node=values, package="_global_")
