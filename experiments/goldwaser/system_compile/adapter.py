"""The compiled change as a PEFT LoRA adapter's files (format=peft): each changed matrix's ΔW = W_compiled − W_base
factored by SVD into B·A at the method's rank (the bake's LoRA rank; the analytic patch's analytic_rank=, its
truncation), written as `adapter_config.json` + `adapter_model.safetensors` with scaling 1 (lora_alpha = r),
so that `AutoPeftModelForCausalLM.from_pretrained(DIR)` computes W x + B A x: megabytes instead of a checkpoint.
Which base the config names: adapter_base.py; the refusals, before any model is loaded: adapter_checks.py; the
adapter loaded back and measured in the run: adapter_reload.py, checkpoint.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from experiments.core.errors import UserError

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def lora_form(module: nn.Module) -> str | None:
    """How peft's LoRA wraps `module`: "linear" (W stored (out, in)), "conv1d" (transformers' Conv1D, GPT-2's:
    W stored (in, out), which peft calls fan_in_fan_out), or None: a module whose change no LoRA layer the
    adapter writes can hold (a norm, an embedding, an MoE's stacked experts)."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, Conv1D):
        return "conv1d"
    return "linear" if isinstance(module, nn.Linear) else None


@dataclass(frozen=True)
class LoraFactors:
    """Per changed module (its full name): (A (r × in), B (out × r)) in peft's orientation, with B A the best
    rank-r approximation of its ΔW read as a Linear's (out, in); and whether some module is a Conv1D."""

    modules: dict[str, tuple[Tensor, Tensor]]
    conv1d: bool


@torch.no_grad()
def lora_factors(model: nn.Module, originals: dict[str, Tensor], rank: int) -> LoraFactors:
    params = dict(model.named_parameters())
    modules, conv1d = {}, False
    for name, original in originals.items():
        delta = params[name].detach().double() - original.double()
        if not bool(delta.any()):
            continue
        owner = name.removesuffix(".weight")
        form = lora_form(model.get_submodule(owner)) if name.endswith(".weight") else None
        if form is None:  # adapter_checks.check_peft refused this before the model was loaded: a bug if reached
            raise RuntimeError(f"format=peft: the change to {name} is no LoRA layer's matrix")
        if form == "conv1d":
            # peft's LoRA on a Conv1D keeps A (r × in) and B (out × r) as for a Linear and transposes B A when
            # it adds it to the (in, out) weight: factor ΔWᵀ, the (out, in) matrix those factors stand for
            delta, conv1d = delta.T, True
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        r = min(rank, s.numel())
        modules[owner] = (vh[:r].contiguous(), (u[:, :r] * s[:r]).contiguous())
    return LoraFactors(modules, conv1d)


def write_adapter(folder: Path, factors: LoraFactors, rank: int, base: str, dtype: torch.dtype) -> None:
    """adapter_config.json and adapter_model.safetensors; `base` is the name the config gives the base model
    (adapter_base.base_name)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from experiments.core.atomic import save_pretrained, write_atomic

    if not factors.modules:
        raise UserError("format=peft: the compiled change is zero: there is no adapter to write")
    # task_type: AutoPeftModelForCausalLM refuses a config without it ("Cannot infer the auto class").
    # fan_in_fan_out: what peft expects of a Conv1D; a Linear beside it (a mixed target list) is set back to
    # False by peft per module, with a warning, and reads the same factors
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(factors.modules), lora_dropout=0.0,
                        bias="none", task_type="CAUSAL_LM", fan_in_fan_out=factors.conv1d,
                        base_model_name_or_path=base)
    save_pretrained(config, Path(folder))
    tensors = {}
    for module, (a, b) in factors.modules.items():
        pad = rank - a.shape[0]  # a module whose ΔW has fewer directions than the rank: zero rows, no change
        a = torch.cat([a, a.new_zeros(pad, a.shape[1])]) if pad else a
        b = torch.cat([b, b.new_zeros(b.shape[0], pad)], 1) if pad else b
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.to(dtype).contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.to(dtype).contiguous()
    write_atomic(Path(folder) / ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, str(tmp)))


def peft_rank(cfg, method: str) -> int:
    """The adapter's rank: the bake's LoRA rank, the analytic patch's truncation."""
    return cfg.rank if method == "bake" else cfg.analytic_rank
