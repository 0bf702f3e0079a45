"""What a layer above the zoo tells its loader, handed in by the caller as an argument, never registered.

The zoo loads models by name; which of them can be patched, the families' tiny random test models and what
an adapter asks of `from_pretrained` are patching's knowledge, and patching sits above the zoo. So the zoo
imports nothing of it: a caller that needs those passes a `Catalog` (patching/load.py builds patching's), and
the plain loader (`PLAIN`) loads any causal LM transformers can build, its own offline models included.
Passed rather than registered: with a registry filled when patching is imported, what `load_model` accepts
would depend on what the caller happened to import first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


def _accept(_thing: Any) -> None:
    """No check: every config, every loaded model."""


def _no_kwargs(_config: Any) -> dict:
    return {}


def _anything() -> str:
    return "any causal LM transformers can build"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per caller's catalog
class Catalog:
    # more offline random models: name -> its transformers config for a vocabulary size (the byte tokenizer's)
    offline: Mapping[str, Callable[[int], Any]] = field(default_factory=dict)
    # a config's check before any weight is read or a GGUF converted: one UserError line when it is refused
    require: Callable[[Any], None] = _accept
    # extra `from_pretrained` / `from_config` keywords for a config (an MoE's experts run eagerly)
    load_kwargs: Callable[[Any], dict] = _no_kwargs
    # the loaded model's check (float64, eval mode already set): one UserError line when it is refused
    check_loaded: Callable[[Any], None] = _accept
    # what is accepted, in words, for messages
    supported: Callable[[], str] = _anything


PLAIN = Catalog()  # the zoo alone: no check, no extra model
