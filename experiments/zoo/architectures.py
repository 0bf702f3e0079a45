"""Which architectures the zoo loads: a gate that the layer above installs.

Only architectures that context patching can handle are worth loading (a model without an adapter would
be converted or downloaded, then refused). The list of those lives with the adapters in
experiments/patching/arch/, above the zoo; the zoo cannot import it (patching imports the zoo, so that
would be a cycle). Instead patching/arch/__init__.py installs its check here when it is imported, and
the zoo asks `require(model_type)` before it reads a weight. Every caller that refuses an architecture
(patch_match, layer_errors, context_compile and their tests) imports patching.arch to check the variant
anyway, so the gate is in place when it matters. Without a gate (a caller that never patches) every
architecture transformers knows is loaded.
"""

from __future__ import annotations

from collections.abc import Callable

_require: Callable[[str], object] | None = None
_supported: Callable[[], str] | None = None


def install(require: Callable[[str], object], supported: Callable[[], str]) -> None:
    """`require(model_type)` raises a UserError for an architecture that cannot be used; `supported()`
    names those that can, for messages."""
    global _require, _supported
    _require, _supported = require, supported


def require(model_type: str) -> None:
    """One line naming the supported architectures when `model_type` is not one of them."""
    if _require is not None:
        _require(model_type)


def supported() -> str:
    return _supported() if _supported is not None else "any that transformers knows"
