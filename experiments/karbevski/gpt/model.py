"""A GPT you can read in one sitting, in the shape of nanoGPT's model.py (learned positions, LayerNorm
without bias, GELU MLP, tied embedding and head, flash attention through `scaled_dot_product_attention`),
with the knobs Karbevski & Mijoski vary in §5.1:

- `query="identity"`: W_Q = I_d. Each head's query is its coordinate slice of the block's normalized
  input (the ln_1 output), as in the authors' code; the block has no query parameters at all.
- `mlp_hidden`: the MLP width (3.5×, 4× or 4.5× d_model in Table 2).
- `attn_scale_mult`: the score scale is attn_scale_mult / √d_k (1 for the baselines, 1/2 for W_Q = I).
No dropout: nanoGPT pretrains with dropout 0 and the paper does not mention any.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.karbevski.gpt.lm_loss import DEFAULT_CHUNK, chunked_cross_entropy

QUERIES = ("learned", "identity")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50 257 padded up to a multiple of 64, as nanoGPT does
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    mlp_hidden: int = 3072
    query: str = "learned"  # learned | identity (W_Q = I)
    attn_scale_mult: float = 1.0  # scores are scaled by attn_scale_mult / sqrt(d_k)

    def __post_init__(self):
        if self.query not in QUERIES:
            raise ValueError(f"query={self.query!r} must be one of {QUERIES}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def attn_scale(self) -> float:
        return self.attn_scale_mult / math.sqrt(self.head_dim)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        # With W_Q = I only keys and values are projected: c_attn holds [W_K | W_V], 2d outputs, not 3d.
        n_projections = 3 if cfg.query == "learned" else 2
        self.c_attn = nn.Linear(cfg.d_model, n_projections * cfg.d_model, bias=False)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        projected = self.c_attn(x)
        if self.cfg.query == "learned":
            q, k, v = projected.split(C, dim=2)
        else:
            k, v = projected.split(C, dim=2)
            q = x  # W_Q = I: the normalized input is the query
        heads = (B, T, self.cfg.n_head, self.cfg.head_dim)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.cfg.attn_scale)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.gelu = nn.GELU()  # exact (erf) GELU, as nanoGPT
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.d_model),
            wpe=nn.Embedding(cfg.block_size, cfg.d_model),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.d_model, bias=False),
        ))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2 and the paper
        # tokens per chunk of the training loss: an attribute, not a GPTConfig field, since it changes no
        # result (the chunked loss equals the unchunked one) and the config is a checkpoint's identity
        self.loss_chunk = DEFAULT_CHUNK
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def hidden(self, idx: Tensor) -> Tensor:
        """The final hidden states (B, T, d): ln_f's output, what the head reads."""
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """Without targets: the logits (B, T, vocab), no loss. With targets: no logits (None) and the mean
        next-token cross-entropy, the head and the loss computed `loss_chunk` tokens at a time
        (lm_loss.chunked_cross_entropy), so a training step never holds the B × T × vocab logits."""
        h = self.hidden(idx)
        if targets is None:
            return self.lm_head(h), None
        return None, chunked_cross_entropy(h, self.lm_head.weight, targets, self.loss_chunk)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's split: weight decay on every parameter with 2 or more dimensions (matmul weights and
    embeddings), none on the 1-D LayerNorm scales."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B as in nanoGPT's estimate_mfu:
    6N for the weights plus 12·L·d·T for the attention scores and their weighted sum."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.d_model * cfg.block_size
