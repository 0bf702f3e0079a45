"""Check a command line before Hydra starts a run, so bad input costs one clear line and leaves
no half-made run folder behind.

Unknown keys are caught by composing the config; ill-typed values by comparing each override
with the type of the value it replaces (Hydra itself would silently turn `seed=abc` into a
string). Sweeps are expanded and every combination is checked.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf

from experiments.core import registry
from experiments.core.errors import UserError
from experiments.core.runtime import DEVICES, DTYPES

MAX_COMBINATIONS_CHECKED = 64


def _first_line(err: BaseException) -> str:
    msgs = []
    while err is not None:
        text = str(err).strip()
        if text:
            msgs.append(text.splitlines()[0])
        err = err.__cause__ or err.__context__
    return msgs[0] if msgs else "invalid configuration"


def _compose(overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(registry.CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def _is_group(key: str) -> bool:
    return key.startswith("hydra/") or (registry.CONF_DIR / key).is_dir()


def _type_error(key: str, ref: Any, value: Any) -> str | None:
    """Why `value` can't replace `ref`, or None when it can."""
    if ref is None or value is None:
        return None
    want: str | None = None
    if isinstance(ref, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(ref, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(ref, float):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(ref, (list, ListConfig)):
        ok, want = isinstance(value, (list, ListConfig)), "a list like [a,b]"
    elif isinstance(ref, (dict, DictConfig)):
        ok, want = isinstance(value, (dict, DictConfig)), "a mapping like {a:1}"
    else:  # strings accept any scalar: `prompt=2024` is still a prompt
        ok = not isinstance(value, (list, dict, ListConfig, DictConfig))
        want = "a single value"
    return None if ok else f"{key}={value!r} is ill-typed: expected {want}"


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


def _check_values(cfg: DictConfig, parsed: list[Override], ref: DictConfig, free_form: tuple[str, ...]) -> None:
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or o.is_add() or o.is_force_add() or key.startswith("hydra") or _is_group(key):
            continue
        if key in free_form:
            continue  # the experiment's validate() checks it
        if o.is_sweep_override():
            continue  # checked in the expanded combinations
        value = o.value()
        if OmegaConf.select(ref, key, default="__missing__") == "__missing__":
            continue  # compose already refused unknown keys; this is a key the preset adds
        problem = _type_error(key, OmegaConf.select(ref, key), value)
        if problem:
            raise UserError(problem)
    dtype = str(cfg.get("dtype", "float32")).lower()
    if dtype not in DTYPES:
        raise UserError(f"dtype={cfg.dtype!r} is not one of {', '.join(DTYPES)}")
    device = str(cfg.get("device", "auto")).lower()
    if device not in DEVICES and not device.startswith("cuda:"):
        raise UserError(f"device={cfg.device!r} is not one of {', '.join(DEVICES)}")


def _unknown_key_message(err: HydraException, name: str) -> str:
    text = str(err)
    if "Could not override" in text or "Key '" in text and "not in struct" in text:
        key = text.split("'")[1] if "'" in text else "?"
        return (f"unknown config key {key!r} for experiment {name} "
                f"(see `icl-exp run {name} --cfg job`; to add a new key use +{key}=...)")
    if "Could not find" in text or "Could not load" in text:
        return _first_line(err)
    return _first_line(err)


def validate(name: str, overrides: list[str]) -> DictConfig:
    """Raise UserError for an unknown experiment or a bad override; return the composed config."""
    exp = registry.get(name)
    hydra_flags = [o for o in overrides if o.startswith("-")]
    plain = [o for o in overrides if not o.startswith("-")]
    if hydra_flags:
        plain = [o for o in plain if "=" in o]  # `--cfg job` etc. take a word after them
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except HydraException as err:
        raise UserError(f"cannot parse overrides: {_first_line(err)}") from None
    if any(o.key_or_group == "experiment" for o in parsed):
        raise UserError("give the experiment as `icl-exp run NAME`, not experiment=NAME")
    groups = [o.input_line for o in parsed if not o.is_sweep_override() and o.key_or_group == "preset"]
    try:
        ref = _compose([f"experiment={name}", *groups])
    except HydraException as err:
        raise UserError(_unknown_key_message(err, name)) from None
    cfg = ref
    for combo in _expand(parsed):
        try:
            cfg = _compose([f"experiment={name}", *combo])
        except HydraException as err:
            raise UserError(_unknown_key_message(err, name)) from None
        combo_parsed = OverridesParser.create().parse_overrides(combo)
        _check_values(cfg, combo_parsed, ref, exp.free_form_keys)
        if exp.validate is not None:
            exp.validate(cfg)
    GlobalHydra.instance().clear()
    return cfg


def check_writable(folder: str | os.PathLike) -> None:
    """The output folder (or the nearest folder above it that exists) must be a writable folder."""
    path = Path(folder).expanduser().absolute()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"cannot write the output folder {path}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"cannot write the output folder {path}: {probe} is not writable")
    if path.exists() and any(path.iterdir()) and (path / "run.json").exists():
        raise UserError(f"{path} already holds a run; choose another hydra.run.dir")
