"""Check a command line before Hydra starts a run, so bad input costs one clear line and leaves
no half-made run folder behind.

Unknown keys and ill-typed values are caught by composing the config (the experiment's schema,
experiments/<paper>/schema.py, types its keys) and worded by cli/config_errors.py. What composition
cannot see is checked here: a sweep without -m, a group option or launcher that is not there, `--flags`,
and, for each job's config, `check_job` (the device, threads, a misspelt offline model, the experiment's
own validate()). Sweeps are expanded and every combination (up to MAX_COMBINATIONS_CHECKED) is checked
before any job starts; a job does not check its config again.
"""

from __future__ import annotations

import difflib
import itertools
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from cli.config_errors import composition_error, known_keys_hint, leaf_keys, omegaconf_cause
from cli.hydra_flags import FLAGS as HYDRA_FLAGS
from cli.hydra_flags import ONE_CONFIG
from experiments.core import registry
from experiments.core.config_schema import DEVICES, GROUP, register_schemas
from experiments.core.errors import UserError, first_line
from experiments.core.registry import Experiment

MAX_COMBINATIONS_CHECKED = 64


def _compose(overrides: list[str]) -> DictConfig:
    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(registry.CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def _is_group(key: str) -> bool:
    return key.startswith("hydra/") or (registry.CONF_DIR / key).is_dir()


def _check_schema_registered(name: str) -> None:
    """Every experiment has a schema (experiments/<paper>/schema.py): its keys, their types and defaults.
    Without one it has no config to compose. A developer's error, said as one, before composing."""
    from hydra.core.config_store import ConfigStore

    register_schemas()
    if f"{name}.yaml" not in ConfigStore.instance().list(GROUP):
        raise UserError(f"experiment {name} has no schema: add its dataclass (its keys, types and defaults) to "
                        f"experiments/<paper>/schema.py and its line to SCHEMAS there, as every other experiment does")


def _check_device(cfg: DictConfig) -> None:
    """`device=` is a string in the schema (cuda:N is not an Enum member); CUDA asked for on a machine
    without it is said before any run folder. Torch is imported only for a cuda device."""
    device = str(cfg.get("device", "auto")).lower()
    if device not in DEVICES and not device.startswith("cuda:"):
        raise UserError(f"device={cfg.device!r} is not one of {', '.join(DEVICES)}")
    if device.startswith("cuda"):
        from experiments.core.runtime import launched_elsewhere, resolve_device  # torch: 1.5 s

        if not launched_elsewhere(cfg):
            resolve_device(device)


def _expand(parsed: list[Override]) -> list[list[str]]:
    """All combinations of a sweep's values (choice and range sweeps), as plain override lists."""
    options: list[list[str]] = []
    for o in parsed:
        if o.is_sweep_override():
            try:
                values = list(o.sweep_string_iterator())
            except Exception:  # interval / glob sweeps: leave them to Hydra
                values = []
            if not values:
                continue
            options.append([f"{o.get_key_element()}={v}" for v in values])
        else:
            options.append([o.input_line])
    combos = itertools.islice(itertools.product(*options), MAX_COMBINATIONS_CHECKED)
    return [list(c) for c in combos]


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (registry.CONF_DIR / group).glob("*.yaml"))


def _check_sweeps_and_groups(name: str, parsed: list[Override], multirun: bool) -> None:
    """A comma-separated value without -m (Hydra's answer is a five-line ambiguity message), and a
    config group option that does not exist (`preset=gpu`), named with the options there are."""
    for o in parsed:
        key = o.key_or_group
        if o.is_sweep_override() and not multirun:
            raise UserError(f"{o.input_line} gives several values: use -m to sweep "
                            f"(icl-exp run {name} -m {o.input_line}), or quote a single value")
        if _is_group(key) and not key.startswith("hydra") and not o.is_delete():
            options = _group_options(key)
            try:
                values = [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [str(o.value())]
            except Exception:  # interval / glob sweeps: Hydra judges them
                values = []
            for value in values:
                if value not in options:
                    close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
                    mean = f"; did you mean {key}={close[0]}?" if close else ""
                    raise UserError(f"{key}={value} is not a {key}: choose one of {', '.join(options)}{mean}")


def _check_added_keys(parsed: list[Override], ref: DictConfig) -> None:
    """`+key` (or `++key`) for a key no experiment reads: Hydra adds it, nobody reads it, the run
    silently uses the default. Group additions (`+group=option`) and Hydra's own keys pass."""
    for o in parsed:
        key = o.key_or_group
        if _is_group(key) or key.startswith("hydra"):
            continue
        if o.is_add() or o.is_force_add():
            if OmegaConf.select(ref, key, default="__missing__") == "__missing__":
                raise UserError(f"{o.input_line}: no experiment reads {key!r}, so it would be ignored "
                                f"({known_keys_hint(key, ref)})")


def _check_threads(cfg: DictConfig) -> None:
    threads = cfg.get("threads")  # an integer or null: Common types it
    if threads is not None and threads < 1:
        raise UserError(f"threads={threads} must be at least 1 (or null for torch's default)")




def _check_flags(name: str, overrides: list[str]) -> None:
    """`--preset cpu` (or `--seed=1`): argparse-style options are not Hydra overrides, and Hydra's answer
    is its eight-line usage. Say the override it meant, or that the option is unknown."""
    for i, arg in enumerate(overrides):
        if not arg.startswith("-") or arg.split("=", 1)[0] in HYDRA_FLAGS:
            continue
        key, _, value = arg.lstrip("-").partition("=")
        typed = arg
        if not value and i + 1 < len(overrides) and not overrides[i + 1].startswith("-") \
                and "=" not in overrides[i + 1]:
            value = overrides[i + 1]
            typed = f"{arg} {value}"
        try:
            keys = leaf_keys(_compose([f"experiment={name}"]))
        except HydraException:
            keys = []
        candidates = (key, key.replace("-", "_"), key.replace("-", "."))
        known = next((k for k in candidates if k in keys or (_is_group(k) and not k.startswith("hydra"))), None)
        if known:
            raise UserError(f"{typed}: overrides take no dashes: use {known}={value or 'VALUE'} "
                            f"(icl-exp run {name} {known}={value or 'VALUE'})")
        raise UserError(f"unknown option {arg}; settings are key=value overrides (see `icl-exp run {name} --cfg "
                        f"job`), and the options are -m and Hydra's: --cfg job, --info, --resolve, --package")


# hydra/launcher=OPTION -> (the plugin module it needs, the extra that installs it, the package)
LAUNCHER_EXTRAS = {
    "parallel": ("hydra_plugins.hydra_joblib_launcher", "joblib", "hydra-joblib-launcher"),
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "joblib", "hydra-joblib-launcher"),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm", "hydra-submitit-launcher"),
}


def _plugin_installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # hydra_plugins itself missing
        return False


def _check_launcher(parsed: list[Override]) -> None:
    """`hydra/launcher=parallel` without the joblib extra: Hydra says "Could not load
    'hydra/launcher/joblib'"; name the extra that installs it instead."""
    for o in parsed:
        if o.key_or_group != "hydra/launcher" or o.is_delete():
            continue
        try:
            values = [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [str(o.value())]
        except Exception:
            continue
        for value in values:
            if value in LAUNCHER_EXTRAS and not _plugin_installed(LAUNCHER_EXTRAS[value][0]):
                _, extra, package = LAUNCHER_EXTRAS[value]
                raise UserError(f"hydra/launcher={value} needs the {extra} extra, which is not installed: "
                                f"pip install -e '.[{extra}]' (installs {package})")


def _check_logger(parsed: list[Override]) -> None:
    """`logger=mlflow` without its package: the extra that installs it, in one line, before any run."""
    from experiments.core.trackers import EXTRAS

    for o in parsed:
        if o.key_or_group != "logger" or o.is_delete():
            continue
        try:
            values = [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [str(o.value())]
        except Exception:
            continue
        for value in values:
            if value in EXTRAS and not _plugin_installed(EXTRAS[value][0]):
                raise UserError(f"logger={value} needs the {EXTRAS[value][1]} extra, which is not installed: "
                                f"pip install -e '.[{EXTRAS[value][1]}]'")


def _check_parallel_gpus(configs: list[DictConfig]) -> None:
    """hydra/launcher=parallel runs CUDA jobs one per GPU: an n_jobs it cannot honour, or the launcher under
    torchrun, is said here, before any job starts (experiments/core/parallel_launcher.py plans the same)."""
    if configs and "icl_exp_parallel" in str(OmegaConf.select(configs[0], "hydra.launcher._target_", default="")):
        from experiments.core.parallel_launcher import check_sweep

        check_sweep(configs)


def _check_model_name(cfg: DictConfig) -> None:
    """`model=tiny-lama`: not a folder here, and so close to an offline model's name that it is a typo,
    not a hub id (which would be tried on the hub, a 3 s probe offline, and fail there)."""
    model = cfg.get("model")
    if not isinstance(model, str) or "/" in model or Path(model).expanduser().exists():
        return
    from experiments.zoo.loading import RANDOM_OFFLINE_MODELS, TRAINED_OFFLINE_MODELS

    known = (*TRAINED_OFFLINE_MODELS, *RANDOM_OFFLINE_MODELS)  # the registry's trained ones too (qwen2.5-1.5 -> -1.5b)
    if model in known:
        return
    close = difflib.get_close_matches(model, known, n=1, cutoff=0.8)
    if close:
        raise UserError(f"model={model} is neither an offline model nor a local folder: did you mean "
                        f"model={close[0]}? (offline models: {', '.join(known)}; a hub id is "
                        f"org/name, e.g. meta-llama/Llama-3.2-1B)")


def _this_process_runs_on(cfg: DictConfig) -> None:
    """A plain run on CUDA runs in this process, on cuda:K or the current GPU: its checks may read that GPU's
    free memory (zoo/loading.available_bytes), since the context this creates is the run's own. Not for a
    sweep (its jobs may run in other processes, on other GPUs) nor under torchrun (each rank takes its
    LOCAL_RANK's GPU later): their checks read the card's total memory, creating no context."""
    device = str(cfg.get("device", "auto")).lower()
    if device == "cpu" or not (device == "auto" or device.startswith("cuda")):
        return
    import torch

    from experiments.core import distributed, runtime

    if runtime.launched_elsewhere(cfg) or distributed.info().distributed or not torch.cuda.is_available():
        return
    try:
        index = torch.device(device).index if device.startswith("cuda:") else torch.cuda.current_device()
    except RuntimeError:  # not a device: _check_device says so
        return
    if index is not None and 0 <= index < torch.cuda.device_count():
        runtime.RUN_GPUS.add(index)


def _warn_slow_float64(exp: Experiment, configs: list[DictConfig]) -> None:
    """One warning line per GPU for float64 jobs (dtype=float64, or float64 in dtypes=) on a card that runs
    float64 at a small fraction of its float32 rate: not an error, the run is right, only slow."""
    said: set[int] = set()
    for cfg in configs:
        dtypes = [str(cfg.get("dtype", ""))] + [str(d) for d in (cfg.get("dtypes") or [])]
        device = str(cfg.get("device", "auto")).lower()
        if exp.computes_in or not {"float64", "fp64"} & set(dtypes) or device == "cpu":
            continue
        import torch

        from experiments.core.distributed import is_main_process
        from experiments.core.gpu_rates import float64_slowdown
        from experiments.core.runtime import launched_elsewhere

        if launched_elsewhere(cfg) or not torch.cuda.is_available() or not is_main_process():  # said once
            continue
        index = torch.device(device).index if device.startswith("cuda:") else torch.cuda.current_device()
        slow = float64_slowdown(index) if index not in said else None
        said.add(index)
        if slow:
            ratio, card = slow
            print(f"warning: dtype=float64 on cuda:{index} ({card}): this card computes float64 at 1/{ratio} of "
                  f"its float32 rate, so the float64 work of {exp.name} will take about {ratio}x longer than in "
                  f"float32 (an A100 or H100 runs float64 at 1/2)", file=sys.stderr)


def check_job(exp: Experiment, cfg: DictConfig) -> None:
    """Every check of one job's composed config that its types cannot make, in one place: the CLI runs it
    for each job of a command line before any job starts, and the job does not run it again."""
    _check_device(cfg)
    _check_threads(cfg)
    _check_model_name(cfg)
    if exp.validate is not None:
        from experiments.core import runtime

        with runtime.checking(cfg):  # the typed config has no Hydra node: where the job runs is said beside it
            exp.validate(exp.config(cfg))


def validate(name: str, overrides: list[str], multirun: bool = True) -> DictConfig:
    """Raise UserError for an unknown experiment or a bad override; return the composed config.
    `multirun=False` (a plain `icl-exp run`): a comma-separated value is an error that says to use -m."""
    return check_command_line(name, overrides, multirun)[1]


def check_command_line(name: str, overrides: list[str], multirun: bool) -> tuple[Experiment, DictConfig]:
    """validate(), and the experiment it ran: the command line checked, every job's config composed and
    checked (check_job); the experiment and the last job's config (the one config of a plain run)."""
    registry.check_name(name)  # the module (and torch) is imported once the command line has composed
    _check_schema_registered(name)
    _check_flags(name, overrides)
    hydra_flags = [o for o in overrides if o.startswith("-")]
    shown = [f for f in hydra_flags if f.split("=", 1)[0] in ONE_CONFIG]
    if multirun and shown:  # Hydra's answer is a traceback ("Only one of --run, --multirun, --cfg ...")
        raise UserError(f"{shown[0]} shows one job's config, and -m sweeps: drop -m and give each key one value "
                        f"(icl-exp run {name} KEY=VALUE {shown[0]}{' job' if shown[0] in ('--cfg', '-c') else ''})")
    plain = [o for o in overrides if not o.startswith("-")]
    if hydra_flags:
        plain = [o for o in plain if "=" in o]  # `--cfg job` etc. take a word after them
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except HydraException as err:
        raise UserError(f"cannot parse overrides: {first_line(err, chain=True)}") from None
    _check_launcher(parsed)
    _check_logger(parsed)
    if any(o.key_or_group == "experiment" for o in parsed):
        raise UserError("give the experiment as `icl-exp run NAME`, not experiment=NAME")
    _check_sweeps_and_groups(name, parsed, multirun)
    groups = [o.input_line for o in parsed if not o.is_sweep_override() and o.key_or_group == "preset"]
    keys = [o.key_or_group for o in parsed]
    composed: dict[str, DictConfig] = {}

    def reference() -> DictConfig:
        """The config without the overrides (the keys there are, the types of their defaults), composed
        only when needed: each composition costs about 0.3 s, and a typed experiment's bad value needs none."""
        if "ref" not in composed:
            try:
                composed["ref"] = _compose([f"experiment={name}", *groups])
            except HydraException as err:
                raise UserError(composition_error(err, name, keys, None)) from None
        return composed["ref"]

    if any(o.is_add() or o.is_force_add() for o in parsed):
        _check_added_keys(parsed, reference())
    # every combination composed first: a bad value anywhere in a sweep is said before torch is imported
    configs = []
    for combo in _expand(parsed):
        try:
            configs.append(_compose([f"experiment={name}", *combo]))
        except HydraException as err:
            known = reference() if isinstance(omegaconf_cause(err), (ConfigKeyError, ConfigAttributeError)) else None
            raise UserError(composition_error(err, name, keys, known)) from None
    exp = registry.get(name)
    if not multirun and configs:
        _this_process_runs_on(configs[-1])
    for cfg in configs:
        check_job(exp, cfg)
    _check_parallel_gpus(configs)
    _warn_slow_float64(exp, configs)
    cfg = configs[-1] if configs else reference()
    GlobalHydra.instance().clear()
    return exp, cfg
