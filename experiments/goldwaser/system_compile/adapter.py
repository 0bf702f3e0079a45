"""The compiled change as a PEFT LoRA adapter (format=peft): each changed matrix's ΔW = W_compiled − W_base
factored by SVD into B·A at the method's rank (the bake's LoRA rank; the analytic patch's analytic_rank=, its
truncation), written as `adapter_config.json` + `adapter_model.safetensors` with scaling 1 (lora_alpha = r),
so that `PeftModel.from_pretrained(base, DIR)` computes W x + B A x: megabytes instead of a checkpoint.
The adapter is then loaded back with peft onto the base weights and measured against the in-process
compiled model, as the merged checkpoint is (checkpoint.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from experiments.core.errors import UserError

ADAPTER_WEIGHTS = "adapter_model.safetensors"


@torch.no_grad()
def lora_factors(model: torch.nn.Module, originals: dict[str, torch.Tensor], rank: int) -> dict[str, tuple]:
    """Per changed module: (A (r × in), B (out × r)) with B A the best rank-r approximation of its ΔW."""
    params = dict(model.named_parameters())
    factors = {}
    for name, original in originals.items():
        delta = params[name].detach().double() - original.double()
        if not bool(delta.any()):
            continue
        if delta.dim() != 2 or not name.endswith(".weight"):
            raise UserError(f"format=peft: the change to {name} (shape {tuple(delta.shape)}) is no LoRA's matrix; "
                            "use format=merged")
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        r = min(rank, s.numel())
        factors[name.removesuffix(".weight")] = (vh[:r].contiguous(), (u[:, :r] * s[:r]).contiguous())
    return factors


def write_adapter(folder: Path, factors: dict[str, tuple], rank: int, base: str, dtype: torch.dtype) -> None:
    from peft import LoraConfig
    from safetensors.torch import save_file

    from experiments.core.atomic import save_pretrained, write_atomic

    if not factors:
        raise UserError("format=peft: the compiled change is zero: there is no adapter to write")
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(factors), lora_dropout=0.0, bias="none",
                        base_model_name_or_path=base)
    save_pretrained(config, Path(folder))
    tensors = {}
    for module, (a, b) in factors.items():
        pad = rank - a.shape[0]  # a module whose ΔW has fewer directions than the rank: zero rows, no change
        a = torch.cat([a, a.new_zeros(pad, a.shape[1])]) if pad else a
        b = torch.cat([b, b.new_zeros(b.shape[0], pad)], 1) if pad else b
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.to(dtype).contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.to(dtype).contiguous()
    write_atomic(Path(folder) / ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, str(tmp)))


class PeftOnBase:
    """The compiled model's weights swapped for base + the adapter loaded by peft, for the `with` block; the
    compiled weights are back afterwards (run_prompt restores the base from them as usual)."""

    def __init__(self, model: torch.nn.Module, originals: dict[str, torch.Tensor], folder: Path):
        self.model, self.originals, self.folder = model, originals, folder

    @torch.no_grad()
    def __enter__(self):
        from peft import PeftModel

        params = dict(self.model.named_parameters())
        self.compiled = {n: params[n].detach().clone() for n in self.originals}
        for n, original in self.originals.items():
            params[n].copy_(original)
        with warnings.catch_warnings():  # transformers' FutureWarning about a name peft reads (bake.py too)
            warnings.simplefilter("ignore", FutureWarning)
            self.wrapped = PeftModel.from_pretrained(self.model, str(self.folder))
        self.wrapped.eval()
        return self.wrapped

    @torch.no_grad()
    def __exit__(self, *exc):
        self.wrapped.unload()  # the LoRA layers out, the base modules back in place
        if hasattr(self.model, "peft_config"):
            del self.model.peft_config
        params = dict(self.model.named_parameters())
        for n, weights in self.compiled.items():
            params[n].copy_(weights)
        return False


def peft_rank(cfg, method: str) -> int:
    """The adapter's rank: the bake's LoRA rank, the analytic patch's truncation."""
    return cfg.rank if method == "bake" else cfg.analytic_rank
