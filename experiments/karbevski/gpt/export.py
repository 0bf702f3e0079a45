"""Export to a stock transformers GPT-2 checkpoint (safetensors + config.json) that
`AutoModelForCausalLM.from_pretrained` loads and that gives the same logits.

The mapping: nanoGPT's nn.Linear weights are (out, in), GPT-2's Conv1D weights (in, out); GPT-2 has biases
everywhere, written as zeros; GELU is the exact one (activation_function="gelu"); the head is tied.
GPT2Config has no free attention scale (only 1/√d_k, optionally divided by the layer index), so a scale
of m/√d_k is folded into the query block exactly: W_Q ← m·W_Q, and for W_Q = I the query block of c_attn
is m·I. The exported W_Q = I model is therefore a stock GPT-2 with a fixed (not trainable-by-design) query.
"""

from __future__ import annotations

from pathlib import Path

import torch

from experiments.core.atomic import save_pretrained
from experiments.karbevski.gpt.model import GPT


def gpt2_config(model: GPT, eot: int | None = None):
    from transformers import GPT2Config

    c = model.cfg
    return GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.d_model, n_layer=c.n_layer,
                      n_head=c.n_head, n_inner=c.mlp_hidden, activation_function="gelu", resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, scale_attn_weights=True,
                      tie_word_embeddings=True, bos_token_id=eot, eos_token_id=eot)


@torch.no_grad()
def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    c = model.cfg
    d = c.d_model
    src = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dtype = src["transformer.wte.weight"].dtype
    out = {"transformer.wte.weight": src["transformer.wte.weight"],
           "transformer.wpe.weight": src["transformer.wpe.weight"],
           "transformer.ln_f.weight": src["transformer.ln_f.weight"],
           "transformer.ln_f.bias": torch.zeros(d, dtype=dtype)}
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        c_attn = src[p + "attn.c_attn.weight"]  # (2d or 3d, d)
        query = c_attn[:d] if c.query == "learned" else torch.eye(d, dtype=dtype)
        kv = c_attn[d:] if c.query == "learned" else c_attn
        full = torch.cat([c.attn_scale_mult * query, kv])  # the scale's multiplier folded into W_Q
        out |= {p + "ln_1.weight": src[p + "ln_1.weight"], p + "ln_1.bias": torch.zeros(d, dtype=dtype),
                p + "ln_2.weight": src[p + "ln_2.weight"], p + "ln_2.bias": torch.zeros(d, dtype=dtype),
                p + "attn.c_attn.weight": full.T.contiguous(),
                p + "attn.c_attn.bias": torch.zeros(3 * d, dtype=dtype),
                p + "attn.c_proj.weight": src[p + "attn.c_proj.weight"].T.contiguous(),
                p + "attn.c_proj.bias": torch.zeros(d, dtype=dtype),
                p + "mlp.c_fc.weight": src[p + "mlp.c_fc.weight"].T.contiguous(),
                p + "mlp.c_fc.bias": torch.zeros(c.mlp_hidden, dtype=dtype),
                p + "mlp.c_proj.weight": src[p + "mlp.c_proj.weight"].T.contiguous(),
                p + "mlp.c_proj.bias": torch.zeros(d, dtype=dtype)}
    return out


def to_gpt2(model: GPT, eot: int | None = None):
    """A transformers GPT2LMHeadModel holding `model`'s function."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(gpt2_config(model, eot)).to(next(model.parameters()).dtype)
    missing, unexpected = hf.load_state_dict(gpt2_state_dict(model), strict=False)
    # the head is tied to wte; older transformers also list the causal-mask buffers as missing
    leftover = [k for k in missing if k != "lm_head.weight" and not k.endswith(("attn.bias", "masked_bias"))]
    if leftover or unexpected:
        raise RuntimeError(f"GPT-2 export: missing {leftover}, unexpected {unexpected}")
    hf.tie_weights()
    return hf.eval()


def export(model: GPT, folder: Path, eot: int | None = None) -> Path:
    folder = Path(folder)
    save_pretrained(to_gpt2(model, eot), folder, safe_serialization=True)  # umask mode, not 0600
    return folder
