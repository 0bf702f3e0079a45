"""A family without an adapter, tried with Llama's when its decoder layer has Llama's module names.

Most decoders in transformers copy Llama's layer and its names (`input_layernorm`, `self_attn`,
`post_attention_layernorm`, `mlp.gate_proj / up_proj / down_proj`); whatever they change inside attention
(q/k norms, biases, rotary variants, sliding windows) Algorithm 1 never reads. So such a family is worth a
trial with the Llama adapter. The names alone prove nothing (Granite has them and scales the MLP's output
before the residual): the trial adapter is used only after the check against the stock layer (check.py)
passes on the loaded model, and a failing family is refused in one line. The names are read from the model
built on the meta device: no weight is read or allocated.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from experiments.patching.arch import llama
from experiments.patching.arch.base import BlockAdapter

LAYER_PARTS = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
NEEDED = {"self_attn", "post_attention_layernorm", "mlp"}  # (OLMo 1's norms have no weights, but are there)
MLP_MATRICES = {"gate_proj", "up_proj", "down_proj"}


def llama_style_adapter(config) -> BlockAdapter | None:
    """The Llama adapter for `config.model_type` when its first decoder layer has Llama's parts and no other
    part holding weights, and its MLP exactly Llama's three linear maps; else None."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        layer = llama.ADAPTER.layers(model)[0]
    except Exception:  # no causal-LM class for it, no `model.layers`: not Llama's shape
        return None
    parts = {name for name, _ in layer.named_children()}
    if not NEEDED <= parts or not _weighted_children(layer) <= LAYER_PARTS:
        return None
    if _weighted_children(layer.mlp) != MLP_MATRICES:
        return None
    if not all(isinstance(getattr(layer.mlp, name), nn.Linear) for name in MLP_MATRICES):
        return None
    return replace(llama.ADAPTER, model_types=(config.model_type,), family=f"Llama-style ({config.model_type})",
                   tiny_model=None, tiny_config=None)


def _weighted_children(module: nn.Module) -> set[str]:
    return {name for name, child in module.named_children() if any(True for _ in child.parameters())}
