"""float64 that is float64: a transformers decoder's own float32 islands re-run in float64.

transformers computes some steps in float32 whatever the model's dtype, so a model cast to float64 is
not float64 end to end:
- RMSNorm (Gemma's `_norm(x.float()) * (1 + w.float())`, Llama's and Mixtral's `x.to(float32)`);
- rotary tables (`position_ids.float() * inv_freq.float()`, then cos/sin in float32);
- eager attention's softmax (`softmax(..., dtype=float32)`): float64 models run SDPA instead, which
  computes in the inputs' dtype.
`exact_float64_(model)` gives those modules an instance `forward` that computes in float64: the same
formula, the same parameters and buffers (the rotary frequencies keep their stored values, which float64
holds exactly), no rounding to float32 anywhere. A float64 run then separates an algorithm from rounding:
a patch that is exact in exact arithmetic is exact to float64's ~1e-16 (tested on the real Gemma 3 block).
Only float64 models are touched; float32 and bfloat16 ones keep transformers' code as it is.
"""

from __future__ import annotations

import types

import torch
from torch import nn


def exact_float64_(model: nn.Module) -> nn.Module:
    """Make `model` (already cast to float64) compute every step in float64; returns it."""
    if next(model.parameters()).dtype != torch.float64:
        return model
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            module.forward = types.MethodType(_gemma_rms_forward if _one_plus(module) else _rms_forward, module)
        elif kind.endswith("RotaryEmbedding") and _has_inv_freq(module):  # (GPT-J's is a stored table)
            module.forward = types.MethodType(_rotary_forward, module)
    for config in (getattr(model, "config", None), getattr(getattr(model, "config", None), "text_config", None)):
        if config is not None and getattr(config, "_attn_implementation", None) == "eager":
            config._attn_implementation = "sdpa"  # eager's softmax is float32; SDPA's is the inputs' dtype
    return model


def _has_inv_freq(module: nn.Module) -> bool:
    return any(name.endswith("inv_freq") for name, _ in module.named_buffers(recurse=False))


def is_exact_float64(model: nn.Module) -> bool:
    return any(getattr(m.forward, "__func__", None) in (_gemma_rms_forward, _rms_forward) for m in model.modules())


def _one_plus(norm: nn.Module) -> bool:
    """Gemma's RMSNorm scales by 1 + weight (weight initialised to 0); Llama's by weight."""
    return "Gemma" in type(norm).__name__


def _eps(norm: nn.Module) -> float:
    return getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6))


def _normalize(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps(norm))


def _gemma_rms_forward(self, x: torch.Tensor) -> torch.Tensor:
    return (_normalize(self, x.double()) * (1.0 + self.weight.double())).type_as(x)


def _rms_forward(self, x: torch.Tensor) -> torch.Tensor:
    return (self.weight.double() * _normalize(self, x.double())).type_as(x)


def _rotary_forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
    prefix = f"{layer_type}_" if layer_type else ""
    inv_freq = getattr(self, f"{prefix}inv_freq").to(device=x.device, dtype=torch.float64)
    scaling = getattr(self, f"{prefix}attention_scaling", 1.0)
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)
