"""Thm 10 (elementwise scale): a post-MLP RMSNorm T = v + m ⊙ d / RMS(d) (Gemma 3, OLMo 2) absorbs r in
its scale, Δm = r ⊘ h with h = d / RMS(d); a coordinate where h is 0 cannot be moved (counted).

Gemma stores m − 1, OLMo 2 stores m: either way Δm lands on the stored weight unchanged, so the rule
needs only h, computed here by the formula both norms use."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching import lemmas
from experiments.patching.capture import last_position
from experiments.patching.lemmas_ls import scale_ls
from experiments.patching.rounded import compute_dtype
from experiments.patching.rules.base import OutputRule, as_rows, module_input


def scale_input(norm: nn.Module, d: Tensor, cdt: torch.dtype) -> Tensor:
    """h = d / RMS(d), what an RMSNorm multiplies by its scale, computed as the norm does: in float32
    (transformers), in float64 for float64 models (zoo/float64.py); `cdt` is that dtype. The formula is
    Gemma3RMSNorm._norm's and Olmo2RMSNorm's (bit for bit); the epsilon is `eps` or `variance_epsilon`."""
    x = d.to(cdt)
    eps = getattr(norm, "eps", None)
    eps = norm.variance_epsilon if eps is None else eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Scale(OutputRule):
    key = "scale"  # Δm = r ⊘ h, h = the normalized output before the scale
    theorem = "Thm 10 (post-norm scale)"
    post_norm = True

    def open_loop(self, adapter, layer, r, values, P, out, cdt, stats):
        dm, stats.div_zero = lemmas.scale_update(r, scale_input(adapter.owner(layer), values["d"], cdt))
        out.copy_(P.to(cdt) + dm)
        stats.dm_linf = dm.abs().max()

    def closed_loop(self, adapter, module, P, out, args, kwargs, target_minus_v, cdt, stats):
        r = self.residual_in_pass(module, P, out, args, kwargs, target_minus_v, cdt)
        dm, stats.div_zero = lemmas.scale_update(r, scale_input(module, last_position(args[0]), cdt))
        out.copy_(P.to(cdt) + dm)
        stats.dm_linf = dm.abs().max()

    def fit_positions(self, adapter, module, P, args, kwargs, R):
        # Δm per coordinate by least squares over the k rows: d parameters, exact only at k = 1. H as the
        # norm computes it (float32; float64 for a float64 model, whose norms compute in float64)
        H = as_rows(scale_input(module, module_input(args, kwargs).reshape(-1, R.shape[1]), compute_dtype(P.dtype)))
        delta = scale_ls(R, H)
        return delta, H * delta
