"""float64 that is float64: a transformers decoder's own float32 islands re-run in float64.

transformers computes some steps in float32 whatever the model's dtype, so a model cast to float64 is
not float64 end to end:
- RMSNorm (Gemma's `_norm(x.float()) * (1 + w.float())`, Llama's and Mixtral's `x.to(float32)`);
- rotary tables (`position_ids.float() * inv_freq.float()`, then cos/sin in float32), from inverse
  frequencies that transformers computes in float32 (`1 / base ** (arange / dim)` rounded to float32);
- eager attention's softmax (`softmax(..., dtype=float32)`): float64 models run SDPA instead, which
  computes in the inputs' dtype; where SDPA cannot run the block (soft-capped attention logits, Gemma 2's,
  which SDPA refuses), eager attention's own formula with its softmax in float64 (`EAGER_FLOAT64`,
  registered with transformers' attention and mask interfaces under its own name).
`exact_float64_(model)` gives those modules an instance `forward` that computes in float64: the same
formula, the same parameters, no rounding to float32 anywhere; the rotary inverse frequencies are computed
again in float64 from the config (`float64_inv_freq`: the default, linear and llama3 rope types; another
type keeps its stored float32 values and says so in one warning). A float64 run then separates an algorithm
from rounding: a patch that is exact in exact arithmetic is exact to float64's ~1e-16 (tested on the real
Gemma 3 block).
Only float64 models are touched; float32 and bfloat16 ones keep transformers' code as it is.
`reload_float64(folder, dtype)` is the one way a saved checkpoint is reloaded for a check (patch_export,
context_compile, system_compile): stock `from_pretrained`, then, for float64, the same float64 steps as the
model that saved it, so a float64 reload is compared with float64's bar, not with float32's rotary tables.
"""

from __future__ import annotations

import copy
import logging
import math
import types

import torch
from torch import nn

log = logging.getLogger(__name__)


def exact_float64_(model: nn.Module) -> nn.Module:
    """Make `model` (already cast to float64) compute every step in float64; returns it."""
    if next(model.parameters()).dtype != torch.float64:
        return model
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            forward = _gemma_rms_forward if scales_by_one_plus(module) else _rms_forward
            module.forward = types.MethodType(forward if _has_weight(module) else _unscaled_rms_forward, module)
        elif kind.endswith("RotaryEmbedding") and _has_inv_freq(module):  # (GPT-J's is a stored table)
            module.inv_freq64 = _float64_tables(module)
            if _standard_tables(module):
                module.forward = types.MethodType(_rotary_forward, module)
    for config in (getattr(model, "config", None), getattr(getattr(model, "config", None), "text_config", None)):
        if config is not None and getattr(config, "_attn_implementation", None) == "eager":
            # eager's softmax is float32; SDPA's is the inputs' dtype, but SDPA refuses soft-capped logits
            config._attn_implementation = EAGER_FLOAT64 if _soft_caps(config) else "sdpa"
    return model


EAGER_FLOAT64 = "eager_float64"  # its name among transformers' attention implementations


def _soft_caps(config) -> bool:
    if not getattr(config, "attn_logit_softcapping", None):
        return False
    _register_eager_float64()
    return True


def _eager_float64_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             softcap: float | None = None, **_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention as transformers writes it (grouped keys repeated, logits scaled, soft-capped, masked),
    its softmax in the inputs' dtype instead of float32. Eval mode only: no dropout."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    logits = query @ key.transpose(2, 3) * (module.head_dim ** -0.5 if scaling is None else scaling)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if attention_mask is not None:
        logits = logits + attention_mask
    weights = torch.softmax(logits, dim=-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


def _register_eager_float64() -> None:
    """EAGER_FLOAT64 among transformers' attention functions, with eager's additive mask (registered once)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(EAGER_FLOAT64, _eager_float64_attention)
    AttentionMaskInterface.register(EAGER_FLOAT64, eager_mask)


def float64_forward(module: nn.Module) -> bool:
    """Whether `module`'s instance forward is one `exact_float64_` gave it (bound to that module): the project's
    own float64 steps, not a replacement (the witness audits instance forwards, patching/witness.py)."""
    forward = vars(module).get("forward")
    return (getattr(forward, "__self__", None) is module
            and getattr(forward, "__func__", None) in (_gemma_rms_forward, _rms_forward, _unscaled_rms_forward,
                                                       _rotary_forward))


def reload_float64(folder, dtype: torch.dtype, **kwargs) -> nn.Module:
    """Stock `AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)` in eval mode; a float64 one
    computes every step in float64 (`exact_float64_`), as the model the project loaded and saved did."""
    from transformers import AutoModelForCausalLM

    return exact_float64_(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs).eval())


def _standard_tables(module: nn.Module) -> bool:
    """Whether the rotary module returns (cos, sin) of [freqs, freqs], as `_rotary_forward` does (GPT-J's is a
    stored table; gpt-oss's returns the half tables): asked of its own forward on two positions."""
    x = torch.zeros(1, dtype=torch.float64, device=module.inv_freq64[next(iter(module.inv_freq64))].device)
    positions = torch.arange(2, device=x.device)[None]
    try:
        theirs = module.forward(x, positions)
        ours = _rotary_forward(module, x, positions)
    except Exception:  # a forward that needs more (Gemma 4's layer type): the standard one, per type
        return True
    if theirs[0].shape == ours[0].shape:
        return True
    log.warning("float64: %s's tables are not the standard layout; its inverse frequencies keep their float32 "
                "values", type(module).__name__)
    return False


def _has_inv_freq(module: nn.Module) -> bool:
    return any(name.endswith("inv_freq") for name, _ in module.named_buffers(recurse=False))


def scales_by_one_plus(norm: nn.Module) -> bool:
    """Whether the RMSNorm scales by 1 + weight (Gemma 1-3, weight initialised to 0) or by the weight itself
    (Llama's, Gemma 4's): asked of the norm itself, a CPU copy with its weight set to 0 run on ones (1 or 0
    out). A class name would not do: Gemma 4's norm scales by its weight."""
    if not _has_weight(norm):
        return False
    probe = copy.deepcopy(norm)
    probe = probe.to_empty(device="cpu") if norm.weight.is_meta else probe.cpu()
    probe = probe.float()
    with torch.no_grad():
        probe.weight.zero_()
        try:
            out = probe(torch.ones(1, 1, norm.weight.shape[-1]))
        except Exception:  # a norm with more inputs (a gated one): not Gemma's
            return False
    return float(out.abs().max()) > 0.5


def _has_weight(norm: nn.Module) -> bool:
    return isinstance(getattr(norm, "weight", None), torch.Tensor)


def _eps(norm: nn.Module) -> float:
    return getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-6))


def _normalize(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps(norm))


def _gemma_rms_forward(self, x: torch.Tensor) -> torch.Tensor:
    return (_normalize(self, x.double()) * (1.0 + self.weight.double())).type_as(x)


def _rms_forward(self, x: torch.Tensor) -> torch.Tensor:
    return (self.weight.double() * _normalize(self, x.double())).type_as(x)


def _unscaled_rms_forward(self, x: torch.Tensor) -> torch.Tensor:  # a norm without a scale (Gemma 4's router)
    return _normalize(self, x.double()).type_as(x)


def float64_inv_freq(rope: dict, head_dim: int) -> torch.Tensor | None:
    """The rotary inverse frequencies of one rope-parameter dict (transformers' `config.rope_parameters`),
    computed in float64: 1 / base^(2i / dim) for the default type, divided by `factor` for linear, with
    Llama 3's wavelength-dependent scaling for llama3; None for another type."""
    kind = rope.get("rope_type", "default")
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    inv = 1.0 / float(rope["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope["factor"])
    if kind == "llama3":  # low frequencies divided by `factor`, high ones kept, the band between interpolated
        factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        context = float(rope["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (context / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > context / low, inv / factor, inv)
        medium = (wavelen >= context / high) & (wavelen <= context / low)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return None


def _float64_tables(module: nn.Module) -> dict[str, torch.Tensor]:
    """Per buffer prefix ("" or a layer type's "sliding_attention_"), the float64 inverse frequencies; the stored
    float32 ones where the rope type has no float64 formula here."""
    config = module.config
    rope = getattr(config, "rope_parameters", None) or {}
    tables = {}
    for name, buffer in module.named_buffers(recurse=False):
        if not name.endswith("inv_freq") or name.endswith("original_inv_freq"):
            continue
        prefix = name[: -len("inv_freq")]
        params = rope.get(prefix[:-1], rope) if prefix else rope
        inv = float64_inv_freq(params, _head_dim(config, prefix[:-1])) if "rope_theta" in params else None
        if inv is None or inv.shape != buffer.shape:
            log.warning("float64: %s rope type %r has no float64 formula here; its inverse frequencies keep their "
                        "float32 values", type(module).__name__, params.get("rope_type"))
            inv = buffer.double()
        tables[prefix] = inv.to(buffer.device)
    return tables


def _head_dim(config, layer_type: str) -> int:
    """The head dimension of `layer_type`'s layers (Gemma 4's differ by type: its config keeps one per layer)."""
    per_layer, types_ = getattr(config, "per_layer_config", None), getattr(config, "layer_types", None)
    if layer_type and per_layer is not None and types_ and layer_type in types_:
        config = per_layer[types_.index(layer_type)]
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rotary_forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
    prefix = f"{layer_type}_" if layer_type else ""
    inv_freq = self.inv_freq64[prefix].to(device=x.device)
    scaling = getattr(self, f"{prefix}attention_scaling", 1.0)
    freqs = position_ids[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)
