"""The chunked LM head + cross-entropy (gpt/lm_loss.py): the unchunked loss's value and gradients (float64
to ~1e-12, float32 and bfloat16 autocast within their rounding), and no tensor of tokens × vocabulary,
checked by the sizes of the tensors every op makes, forward and backward (not by time or a machine's memory)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from experiments.karbevski.gpt.lm_loss import chunked_cross_entropy
from experiments.karbevski.gpt.model import GPT, GPTConfig

N, D, V = 40, 12, 53


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns while active; views (a
    transpose of the weight) are not counted: they allocate nothing."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.numel = max([self.numel, *sizes])
        return out


def inputs(dtype, seed=0, shape=(N,)):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*shape, D, generator=g) * 2).to(dtype).requires_grad_()
    w = torch.randn(V, D, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, V, shape, generator=g)
    return h, w, y


def loss_and_grads(fn, h, w):
    h.grad = w.grad = None
    loss = fn()
    loss.backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk", [1, 7, N, N + 5])
@pytest.mark.parametrize("shape", [(N,), (4, N // 4)])
def test_float64_equals_the_unchunked_loss_and_gradients(chunk, shape):
    h, w, y = inputs(torch.float64, shape=shape)
    ours = loss_and_grads(lambda: chunked_cross_entropy(h, w, y, chunk), h, w)
    ref = loss_and_grads(lambda: F.cross_entropy((h @ w.T).reshape(-1, V), y.reshape(-1)), h, w)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == torch.float64
        assert (a - b).abs().max().item() <= 1e-12 * max(b.abs().max().item(), 1.0)


def test_gradient_scales_with_the_incoming_gradient():
    # gradient accumulation divides the loss: the saved gradients must be scaled, not reused as they are
    h, w, y = inputs(torch.float64)
    (chunked_cross_entropy(h, w, y, 9) * 0.25).backward()
    got = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    (F.cross_entropy(h @ w.T, y) * 0.25).backward()
    assert torch.allclose(got[0], h.grad, rtol=0, atol=1e-14) and torch.allclose(got[1], w.grad, rtol=0, atol=1e-14)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_float32_within_float32_rounding():
    h, w, y = inputs(torch.float32)
    ours = loss_and_grads(lambda: chunked_cross_entropy(h, w, y, 8), h, w)
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = loss_and_grads(lambda: F.cross_entropy(h64 @ w64.T, y), h64, w64)
    assert ours[0].dtype == torch.float32
    for a, b in zip(ours, ref, strict=True):
        assert rel(a, b) < 1e-5


def test_bfloat16_autocast_within_bfloat16_rounding():
    # the unchunked path under autocast: bf16 logits, their float32 copy into the loss (model.py before)
    h, w, y = inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = loss_and_grads(lambda: chunked_cross_entropy(h, w, y, 8), h, w)
        ref = loss_and_grads(lambda: F.cross_entropy((h @ w.T).float(), y), h, w)
    assert ours[0].dtype == torch.float32 and ours[2].dtype == torch.float32  # float32 head weight, grad
    assert rel(ours[0], ref[0]) < 1e-3  # the same bf16 logits, summed in float32
    for a, b in zip(ours[1:], ref[1:], strict=True):
        assert rel(a, b) < 2e-2  # bf16's 8-bit mantissa, rounded at different points


def test_no_gradient_wanted_is_the_same_loss_and_makes_no_gradient():
    h, w, y = inputs(torch.float64)
    with torch.no_grad(), LargestTensor() as seen:  # evaluation: inputs that require grad, grad mode off
        a = chunked_cross_entropy(h, w, y, 6)
    assert a.item() == pytest.approx(F.cross_entropy(h @ w.T, y).item(), rel=1e-13)
    assert seen.numel == 6 * V < min(N * D, V * D)  # a chunk of logits, no gradient buffers


@pytest.mark.parametrize("grad", [True, False])
def test_largest_tensor_is_a_chunk_of_logits(grad):
    n, d, v, chunk = 256, 8, 512, 16
    g = torch.Generator().manual_seed(1)
    h = torch.randn(n, d, generator=g, requires_grad=grad)
    w = torch.randn(v, d, generator=g, requires_grad=grad)
    y = torch.randint(0, v, (n,), generator=g)
    with LargestTensor() as seen:
        loss = chunked_cross_entropy(h, w, y, chunk)
        if grad:
            loss.backward()
    # the bound: a chunk of logits, or the inputs' own shapes (their gradients); never n × v
    assert seen.numel <= max(chunk * v, n * d, v * d) < n * v
    with LargestTensor() as plain:
        F.cross_entropy(h @ w.T, y)
    assert plain.numel == n * v  # the detector sees the unchunked loss's logits


def test_model_loss_and_tied_gradients_equal_the_unchunked_head():
    cfg = GPTConfig(vocab_size=67, block_size=16, n_layer=2, n_head=4, d_model=32, mlp_hidden=128)
    torch.manual_seed(3)
    model = GPT(cfg).double()
    model.loss_chunk = 5  # several chunks, the last one short
    assert model.lm_head.weight is model.transformer.wte.weight
    idx = torch.randint(0, cfg.vocab_size, (3, 13))
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    assert logits is None
    loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = F.cross_entropy(model.lm_head(model.hidden(idx[:, :-1])).reshape(-1, cfg.vocab_size), idx[:, 1:].reshape(-1))
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-12
    for name, p in model.named_parameters():  # wte's gradient: the embedding's and the head's, added
        assert (ours[name] - p.grad).abs().max().item() < 1e-12, name


def test_a_training_step_makes_no_tokens_by_vocabulary_tensor():
    cfg = GPTConfig(vocab_size=640, block_size=16, n_layer=1, n_head=4, d_model=32, mlp_hidden=128)
    model = GPT(replace(cfg))
    model.loss_chunk = 8
    idx = torch.randint(0, cfg.vocab_size, (4, 17))
    with LargestTensor() as seen:
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
    n_tokens = 4 * 16
    # the largest is the embedding's (vocab × d) gradient, half of tokens × vocab here
    assert seen.numel <= cfg.vocab_size * cfg.d_model < n_tokens * cfg.vocab_size


def test_auto_micro_batch_estimate():
    from experiments.karbevski.gpt.memory import fit_micro_batch, state_bytes
    from experiments.karbevski.gpt.params import count_meta

    cfg = GPTConfig()  # GPT-2 124M, T 1024
    n = count_meta(cfg)["total"]
    gib = 2**30
    fits = [fit_micro_batch(cfg, n, f * gib, bf16=True) for f in (1, 16, 40, 80, 140)]
    assert fits[0] == 0 and fits == sorted(fits)  # 1 GiB does not hold the 2.2 GB training state
    assert 12 <= fits[2] < fits[3] < fits[4]  # nanoGPT's 12 sequences fit a 40 GB A100
    assert fit_micro_batch(cfg, n, 40 * gib, bf16=False) < fits[2]  # float32 activations are twice the size
    assert fit_micro_batch(cfg, n, state_bytes(n, True), bf16=True) == 0
