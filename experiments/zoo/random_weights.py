"""Seeded random weights for offline models, drawn so that a random model behaves enough like a trained
one for the patching tests to mean something.

Random models re-draw every weight from a seeded generator so that a run is reproducible and so that
the RMSNorm scales m = 1 + weight are not all 1 (the stable patch inverts them). Weights are scaled by
1/√fan_in, which gives logits with a spread like a trained model's (not a near-uniform distribution on
which every bfloat16 rounding would flip the top token).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from experiments.zoo.float64 import scales_by_one_plus

EMBED_STD = 0.4  # logits of the tied output layer then spread by a few units, like a trained model's


@torch.no_grad()
def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Redraw every weight from a seeded generator: matrices and convolutions N(0, 1/fan_in); token
    and position embeddings and the output layer N(0, EMBED_STD²); Gemma's RMSNorm
    weights N(0, 0.3²), so that its scales m = 1 + w vary (a norm that scales by 1 + w, asked of the
    norm itself: Gemma 4's scales by w); LayerNorm weights 1 + N(0, 0.1²); biases 0."""
    gen = torch.Generator().manual_seed(seed)

    def draw(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float32) * std + mean).to(p.dtype))

    seen: set[int] = set()  # tied weights (lm_head = embed_tokens) are drawn once, as embeddings
    for module in model.modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(module, nn.Embedding) or module is getattr(model, "lm_head", None):
                draw(p, EMBED_STD)
            elif isinstance(module, nn.LayerNorm):
                draw(p, 0.1, 1.0) if pname == "weight" else p.zero_()
            elif pname == "bias":
                p.zero_()
            elif p.ndim >= 2:
                draw(p, 1.0 / math.sqrt(_fan_in(module, p)))
            elif "norm" in type(module).__name__.lower() and scales_by_one_plus(module):  # Gemma 3's: 1 + w
                draw(p, 0.3)
            else:  # RMSNorm weights that are the scale itself (Llama, Mixtral)
                draw(p, 0.3, 1.0)
    return model


def _fan_in(module: nn.Module, p: torch.Tensor) -> int:
    """Inputs per output: GPT-2's Conv1D stores (in, out); an MoE's stacked experts (E, out, in)."""
    if type(module).__name__ == "Conv1D":
        return p.shape[0]
    if p.ndim == 3 and not isinstance(module, nn.Conv1d):
        return p.shape[-1]
    return p[0].numel()
