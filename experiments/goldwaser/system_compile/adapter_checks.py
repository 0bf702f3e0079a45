"""format=peft's refusals, one line each, all from the config before any model is loaded (run.validate): the
adapter can hold only changes of the matrices of Linear and Conv1D modules (adapter.lora_form), so every
matrix the saved method will change must be one. The model is built on the meta device to read its modules
(nothing allocated). What a run could only learn after the compile (a change that is exactly zero) is not
here."""

from __future__ import annotations

from torch import nn

from experiments.core.errors import UserError


def check_peft(cfg, config) -> None:
    """Nothing unless format=peft; then the method `save=` names (analytic | bake) must change LoRA matrices only."""
    if cfg.format != "peft":
        return
    model, model_type = _meta_model(config), config.model_type
    if cfg.save == "analytic":
        from experiments.patching.arch import ADAPTERS, STRUCTURAL

        # a family without an adapter file has its Table 1 forms on trial until the model is loaded: each must do
        for adapter in [ADAPTERS[model_type]] if model_type in ADAPTERS else STRUCTURAL.get(model_type, []):
            layer = adapter.layers(model)[0]
            for name in (*adapter.input_matrices, adapter.output_param):
                if not _is_lora_matrix(layer, name):
                    raise UserError(f"format=peft: the analytic patch of {adapter.family} changes {name} "
                                    f"({_what(layer, name)}, {adapter.theorem}), which a LoRA adapter cannot "
                                    "hold: use format=merged, or method=bake (a LoRA of its own)")
    else:
        for target in cfg.lora_targets:
            for name, module in model.named_modules():
                if (name == target or name.endswith("." + target)) and not _is_lora_matrix(module, "weight"):
                    raise UserError(f"format=peft: lora_targets={target} names {name} ({type(module).__name__}); "
                                    "the adapter holds the changes of Linear and Conv1D modules only: use "
                                    "format=merged")


def _meta_model(config) -> nn.Module:
    import torch
    from transformers import AutoModelForCausalLM

    from experiments.zoo.quiet import quiet_transformers

    with torch.device("meta"), quiet_transformers():
        return AutoModelForCausalLM.from_config(config)


def _is_lora_matrix(root: nn.Module, name: str) -> bool:
    """Whether parameter `name` (relative to `root`) is the weight of a module LoRA wraps."""
    from experiments.goldwaser.system_compile.adapter import lora_form

    owner, _, leaf = name.rpartition(".")
    return leaf == "weight" and lora_form(root.get_submodule(owner)) is not None


def _what(root: nn.Module, name: str) -> str:
    """`name`'s module class and leaf: Gemma3RMSNorm.weight, Conv1D.bias, MixtralExperts.gate_up_proj."""
    owner, _, leaf = name.rpartition(".")
    return f"{type(root.get_submodule(owner)).__name__}.{leaf}"
