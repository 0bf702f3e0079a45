"""The LM head and the cross-entropy in one pass over chunks of tokens, so training never holds the
(tokens × vocabulary) logits at once.

At the paper's shape a micro-batch of 12 × 1024 tokens against GPT-2's 50 304-token vocabulary is 618M
logits: 1.2 GB in bfloat16, then 2.5 GB for their float32 copy, and as much again for its gradient. Here
each chunk of `chunk` tokens makes its logits, their float32 log-sum-exp and, when a gradient is wanted,
its share of the gradients right away (softmax − one-hot, times the head weight and the hidden states), then
drops them: the largest tensor the loss makes is chunk × vocabulary (or the hidden states' and the weight's
own size). Computing the gradients in the forward pass, as Liger-Kernel's fused linear cross-entropy does,
costs no second head matmul in the backward; the backward only scales them by the incoming gradient.

The arithmetic is the unchunked loss's: logits in the compute dtype (bfloat16 under autocast, as the
autocast `nn.Linear` makes them), the softmax in float32 (float64 for float64 inputs), the head weight's
gradient summed over chunks in float32 (or float64). Every target must be a real token (no ignore index:
gpt_wq's windows have none).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Tokens per chunk. 1024 × 50 304 logits are 206 MB in float32: small beside a 124M model's training
# state, and the matmul of 1024 rows is still large enough to run at full speed.
DEFAULT_CHUNK = 1024


def compute_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the unchunked head would multiply in: the autocast dtype where autocast is on for this
    device (the hidden states float32, the head weight float32), else the inputs' common dtype."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax and sums in float64 for float64 work (the exactness tests), else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_ranges(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


def chunk_loss_and_grad(h: Tensor, weight: Tensor, y: Tensor, acc: torch.dtype, want_grad: bool):
    """One chunk: the sum of its token losses, and (want_grad) the unnormalised gradient of that sum with
    respect to the chunk's logits, softmax − one-hot, in the compute dtype."""
    logits = (h @ weight.T).to(acc)
    lse = torch.logsumexp(logits, dim=-1)
    loss = (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()
    if not want_grad:
        return loss, None
    grad = logits.sub_(lse[:, None]).exp_()  # the softmax, in place over the logits' float32 copy
    grad[torch.arange(len(y), device=y.device), y] -= 1
    return loss, grad.to(h.dtype)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(h_i @ Wᵀ, y_i) for h (N, d), W (V, d), y (N,), in chunks of rows."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, y: Tensor, chunk: int, dtype: torch.dtype,
                grad_enabled: bool) -> Tensor:
        acc = accumulate_dtype(dtype)
        hc, wc = h.to(dtype), weight.to(dtype)  # one cast of each, as autocast's linear would make
        # needs_input_grad says True under torch.no_grad too (evaluation): the caller's grad mode decides
        want_h, want_w = grad_enabled and ctx.needs_input_grad[0], grad_enabled and ctx.needs_input_grad[1]
        want = want_h or want_w
        total = torch.zeros((), dtype=acc, device=h.device)
        dh = torch.empty_like(h) if want_h else None
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        for s, e in chunk_ranges(h.shape[0], chunk):
            loss, g = chunk_loss_and_grad(hc[s:e], wc, y[s:e], acc, want)
            total += loss
            if dh is not None:
                dh[s:e] = g @ wc
            if dw is not None:
                dw += (g.T @ hc[s:e]).to(acc)
        n = h.shape[0]
        # the gradients of the mean: the 1/N here, the incoming gradient in backward
        ctx.save_for_backward(dh, None if dw is None else dw.div_(n).to(weight.dtype))
        if dh is not None:
            dh.div_(n)
        return total / n

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * grad_out.to(dh.dtype),
                None if dw is None else dw * grad_out.to(dw.dtype), None, None, None, None)


def chunked_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """F.cross_entropy(h @ weight.T, targets) (mean over tokens), in chunks of `chunk` tokens.

    h: (..., d) hidden states, weight: (V, d) the head (a tied embedding is fine: its gradient is added to
    the embedding's by autograd), targets: (...) token ids. The loss is float32 (float64 for float64
    inputs), as the unchunked loss on `.float()` logits is."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be at least 1")
    dtype = compute_dtype(h, weight)
    flat_h, flat_y = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    # autocast off inside: the function casts once itself and keeps its float32 sums float32
    with torch.autocast(h.device.type, enabled=False):
        return _ChunkedLinearCrossEntropy.apply(flat_h, weight, flat_y, chunk, dtype, torch.is_grad_enabled())
