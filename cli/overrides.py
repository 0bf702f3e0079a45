"""Check a command line before Hydra starts a run, so bad input costs one clear line and leaves
no half-made run folder behind.

`check_line` reads what composition cannot see, composing nothing: a sweep without -m, a group option or
launcher that is not there, `--flags`. A plain run stops there: Hydra composes its config once and its job
checks it (cli/check_job.check_in_job). A sweep goes on in `check_command_line`: every combination (up to
MAX_COMBINATIONS_CHECKED, expanded by compose.py) is composed (unknown keys and ill-typed values refused by
the experiment's config class, worded by cli/config_errors.py) and checked by `check_job` (the device,
threads, a misspelt offline model, the experiment's own validate()) before any job starts; its jobs do not
check again.
"""

from __future__ import annotations

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig

from cli.check_extras import check_launcher, check_logger
from cli.check_job import check_job, check_parallel_gpus, this_process_runs_on, warn_slow_float64
from cli.check_overrides import check_added_keys, check_flags, check_schema_registered, check_sweeps_and_groups
from cli.compose import compose_config, expand
from cli.config_errors import composition_error, refused_in
from cli.hydra_flags import ONE_CONFIG
from experiments.core import registry
from experiments.core.errors import UserError, first_line
from experiments.core.registry import Experiment


def validate(name: str, overrides: list[str], multirun: bool = True) -> DictConfig:
    """Raise UserError for an unknown experiment or a bad override; return the composed config.
    `multirun=False` (a plain `icl-exp run`): a comma-separated value is an error that says to use -m."""
    return check_command_line(name, overrides, multirun)[1]


def check_line(name: str, overrides: list[str], multirun: bool) -> list:
    """What the command line says before any composition (no experiment module, torch or pandas imported):
    the name, `--flags`, a launcher or logger that is there, groups and sweeps (a sweep without -m), an added
    key that is new (the one case that composes: the reference config). Returns the parsed overrides."""
    registry.check_name(name)
    check_schema_registered(name)
    check_flags(name, overrides)
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
    check_launcher(parsed)
    check_logger(parsed)
    if any(o.key_or_group == "experiment" for o in parsed):
        raise UserError("give the experiment as `icl-exp run NAME`, not experiment=NAME")
    check_sweeps_and_groups(name, parsed, multirun)
    if any(o.is_add() or o.is_force_add() for o in parsed):
        check_added_keys(parsed, _reference(name, parsed))
    return parsed


def _reference(name: str, parsed: list) -> DictConfig:
    """The config without the overrides but their preset (the keys there are, the types of their defaults),
    composed only for a `+key`: each composition costs about 0.3 s."""
    groups = [o.input_line for o in parsed if not o.is_sweep_override() and o.key_or_group == "preset"]
    try:
        return compose_config([f"experiment={name}", *groups])
    except HydraException as err:
        raise UserError(composition_error(err, name, [o.key_or_group for o in parsed], None)) from None


def check_command_line(name: str, overrides: list[str], multirun: bool) -> tuple[Experiment, DictConfig]:
    """A sweep's checks, all before its first job: the command line (check_line), every job's config composed
    and checked (check_job); the experiment and the last job's config. (A plain run composes once, in Hydra,
    and its job checks itself: cli/launch.py; under torchrun it is checked here.)"""
    parsed = check_line(name, overrides, multirun)
    keys = [o.key_or_group for o in parsed]
    # every combination composed first: a bad value anywhere in a sweep is said before torch is imported
    configs = []
    for combo in expand(parsed):
        try:
            configs.append(compose_config([f"experiment={name}", *combo]))
        except HydraException as err:
            raise UserError(composition_error(err, name, keys, refused_in(err))) from None
    exp = registry.get(name)
    if not multirun:
        this_process_runs_on(configs[-1])
    for cfg in configs:
        check_job(exp, cfg)
    check_parallel_gpus(configs)
    warn_slow_float64(exp, configs)
    GlobalHydra.instance().clear()
    return exp, configs[-1]  # expand() gives at least one combination: the command line itself
