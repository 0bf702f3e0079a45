"""The adapter loaded back by peft in the process that wrote it, onto the base weights, and the model given back
as it was whatever happens: the run goes on with it (the next method, the next system prompt), and a model
left with peft's layers in it has other parameter names, so that restoring the compiled change would fail
with a KeyError that hides the real error.

    with base_weights(model, originals), lora_loaded(model, folder) as peft_model:
        ...  # peft_model: base + the adapter, as a user's AutoPeftModelForCausalLM computes"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn


@contextmanager
def base_weights(model: nn.Module, originals: dict[str, Tensor]) -> Iterator[None]:
    """The model's changed matrices set back to the base's for the block, the compiled ones back afterwards."""
    with torch.no_grad():
        params = dict(model.named_parameters())
        compiled = {n: params[n].detach().clone() for n in originals}
        for n, original in originals.items():
            params[n].copy_(original)
    try:
        yield
    finally:
        with torch.no_grad():
            params = dict(model.named_parameters())  # read again: the names of the stock model, unwrapped
            for n, weights in compiled.items():
                params[n].copy_(weights)


@contextmanager
def lora_loaded(model: nn.Module, folder: Path) -> Iterator[nn.Module]:
    """`PeftModel.from_pretrained(model, folder)` for the block (in eval mode); peft's layers out again
    afterwards, also when loading fails midway (peft puts its layers in before it reads the weights)."""
    from peft import PeftModel

    try:
        with warnings.catch_warnings():  # transformers' FutureWarning about a name peft reads (bake.py too)
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = PeftModel.from_pretrained(model, str(folder))
        yield wrapped.eval()
    finally:
        unwrap(model)


def unwrap(model: nn.Module) -> None:
    """Every module peft put in place of one of the model's replaced by that module again, and peft's config
    dropped: the stock model, whether or not peft finished wrapping it (what `unload()` does, without the
    PeftModel a failed load never returns). Nothing peft added is left: no LoRA parameter, no name changed."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
    if hasattr(model, "peft_config"):  # a stock model again: save_pretrained must not see an adapter
        del model.peft_config
