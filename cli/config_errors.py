"""Hydra's and OmegaConf's composition errors, worded as the one line a user sees.

Composition does the checking (unknown keys: struct mode; ill-typed values: the experiment's schema, its
config class in experiments/<paper>/<name>/__init__.py); this module only reads the failing exception's
fields (`full_key`, `value`, the node that refused it), never its text, so a rewording in Hydra changes nothing here.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode

from experiments.core.errors import first_line

# What a typed node takes, as the error says it.
EXPECTED = {IntegerNode: "an integer", FloatNode: "a number", BooleanNode: "true or false"}
ITEM_EXPECTED = {int: "an integer", float: "a number", bool: "true or false"}  # items of a typed list


def omegaconf_cause(err: BaseException) -> OmegaConfBaseException | None:
    """The OmegaConf exception that names the key, somewhere in Hydra's chain of causes."""
    while err is not None:
        if isinstance(err, OmegaConfBaseException) and err.full_key:
            return err
        err = err.__cause__ or err.__context__
    return None


def refused_in(err: BaseException) -> DictConfig | None:
    """The config a composition had built when it refused an unknown key: the root of the node that refused
    it, every key of the experiment there, so the error lists them without composing the config again
    (each composition costs about 0.3 s of a one-line answer). None for any other error."""
    cause = omegaconf_cause(err)
    if not isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or cause.parent_node is None:
        return None
    return cause.parent_node._get_root()


def leaf_keys(cfg: DictConfig) -> list[str]:
    """Every settable key of an experiment's config (`train.steps`, `seed`, ...), Hydra's own left out."""
    keys: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        for k in node:
            v = node._get_node(k)
            path = f"{prefix}{k}"
            if isinstance(v, DictConfig) and len(v):
                walk(v, path + ".")
            else:
                keys.append(path)

    walk(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), "")
    return keys


def known_keys_hint(key: str, ref: DictConfig) -> str:
    keys = leaf_keys(ref)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    mean = f"did you mean {close[0]}? " if close else ""
    return f"{mean}keys: {', '.join(keys)}"


def composition_error(err: BaseException, name: str, override_keys: list[str], ref: DictConfig | None) -> str:
    """The one line for `err`, raised while composing experiment `name` with overrides whose keys are
    `override_keys`; `ref` (a config of the experiment, refused_in(err)) lists the keys there are."""
    cause = omegaconf_cause(err)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        # full_key is the first part that does not exist (`trian` of `trian.steps`): name what was typed
        key = next((k for k in override_keys if k == cause.full_key or k.startswith(cause.full_key + ".")),
                   cause.full_key)
        hint = known_keys_hint(key, ref) if ref is not None else f"see `icl-exp run {name} --cfg job`"
        return f"unknown config key {key!r} for experiment {name} ({hint})"
    if isinstance(cause, ValidationError):
        return ill_typed(cause.full_key, cause.value, cause.child_node, cause.parent_node)
    return first_line(err, chain=True, default="invalid configuration")


def ill_typed(key: str, value: Any, node: Any, parent: Any = None) -> str:
    """`seed='abc' is ill-typed: expected an integer`, or for an Enum `dtype='float8' is not one of ...`.
    `node` is the typed node that refused `value`; for an item of a typed list there is none, and the
    list (`parent`) says the items' type."""
    item_type = parent._metadata.element_type if node is None and isinstance(parent, ListConfig) else None
    enum = node._metadata.ref_type if isinstance(node, EnumNode) else item_type
    if isinstance(enum, type) and issubclass(enum, Enum):  # an Enum key, or an item of a list of names (dtypes=)
        names = list(enum.__members__)
        close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
        mean = f"; did you mean {key}={close[0]}?" if close else ""
        return f"{key}={value!r} is not one of {', '.join(names)}{mean}"
    if isinstance(node, ListConfig):
        return f"{key}={value!r} is ill-typed: expected a list like [a,b]"
    if item_type is not None:
        want = ITEM_EXPECTED.get(item_type, "a value of the list's type")
    else:
        want = next((w for t, w in EXPECTED.items() if isinstance(node, t)), "a value of its type")
    if node is not None and node._is_optional():
        want += " (or null)"
    return f"{key}={value!r} is ill-typed: expected {want}"
