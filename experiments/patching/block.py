"""What the capture hooks (capture.py) and the output rules (rules/) read of an architecture adapter, as a
Protocol: they name this, not `arch.base.BlockAdapter`, so that nothing below the adapters imports them.

The adapters hold their output rule (arch/base.py imports rules/), and the rules and the hooks read the
adapter's fields: naming the adapter's class there, even for a type hint, closed a circle of ten modules
(arch/base, capture, rules/*). `BlockAdapter` satisfies this Protocol; tests/zoo/test_layering.py fails on
an import cycle in patching/, type-only imports included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import nn


class Block(Protocol):
    family: str  # a short name, for messages
    mlp: str  # the MLP: its input is z
    residual_at: str | None  # a module whose input is v (None: a parallel block, see `attention`)
    attention: str | None  # a parallel block's attention module, v = x + its output
    input_matrices: dict[str, str]  # parameter -> layout, every matrix reading z
    output_param: str  # the parameter the output rule changes
    captures: dict[str, tuple[str, str]]  # capture name -> (module path, "input" | "output"): what the rule reads

    @property
    def input_modules(self) -> tuple[str, ...]:
        """The modules beside the MLP whose input an input matrix reads (`input_at`), each once."""
        ...

    def owner(self, layer: nn.Module) -> nn.Module:
        """The module whose parameter the output rule changes."""
        ...
