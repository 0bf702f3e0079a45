"""Replies and next-token distributions: batched generation from many inputs at once (left-padded, a KV
cache; greedy, or sampled from a seeded generator), the logits of a model teacher-forced along a reply, and
the comparison of two such logit tables (KL, top-1 agreement).

Generation is batched because on a CPU one step for 16 queries costs about what one step for one does
(the weights are read once). Teacher-forced passes run one sequence at a time: no padding, so what the
run measures is what a stock forward of that sequence gives."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from experiments.patching.compare import comparable
from experiments.patching.patcher import _cache_name  # the KV cache's keyword: `cache` from transformers 5.24


@torch.no_grad()
def generate(model: nn.Module, inputs: list[tuple[int, ...]], max_new: int, stop_ids: set[int], pad_id: int,
             batch: int = 16, generator: torch.Generator | None = None, temperature: float = 1.0) -> list[list[int]]:
    """Each input's reply (at most `max_new` tokens; a stop token ends it and is kept): greedy, or sampled
    at `temperature` when a `generator` is given."""
    replies: list[list[int]] = []
    for first in range(0, len(inputs), batch):
        replies += _generate_batch(model, inputs[first:first + batch], max_new, stop_ids, pad_id, generator,
                                   temperature)
    return replies


def _generate_batch(model, inputs, max_new, stop_ids, pad_id, generator, temperature) -> list[list[int]]:
    device = next(model.parameters()).device
    length = max(len(i) for i in inputs)
    ids = torch.full((len(inputs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(inputs), length), dtype=torch.long)
    for b, seq in enumerate(inputs):  # left padding: every input ends at the last column
        ids[b, length - len(seq):] = torch.tensor(seq)
        mask[b, length - len(seq):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _cache_name(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    replies: list[list[int]] = [[] for _ in inputs]
    done = [False] * len(inputs)
    for _ in range(max_new):
        logits = out.logits[:, -1].float()
        if generator is None:
            token = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, -1)
            token = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
        for b, t in enumerate(token.tolist()):
            if not done[b]:
                replies[b].append(t)
                done[b] = t in stop_ids
        if all(done):
            break
        mask = torch.cat([mask, mask.new_ones((len(inputs), 1))], 1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions,
                    **{cache: getattr(out, cache)}, use_cache=True)
    return replies


@torch.no_grad()
def reply_logits(model: nn.Module, prefix: tuple[int, ...], reply: list[int] | tuple[int, ...]) -> Tensor:
    """The logits (len(reply), V) of `model` fed `prefix` and the reply teacher-forced, in the dtype they are
    compared in (float32; float64 for a float64 model): row i is the next-token distribution that predicts
    reply[i]."""
    device = next(model.parameters()).device
    ids = torch.tensor([[*prefix, *reply[:-1]]], device=device)
    return comparable(model(input_ids=ids, use_cache=False, logits_to_keep=len(reply)).logits[0])


def kl_rows(reference: Tensor, got: Tensor) -> Tensor:
    """KL(reference ‖ got) of each row's next-token distribution (float64): what `got` loses, in nats,
    where the model given the system prompt puts its probability."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(got.double(), -1)
    return (p.exp() * (p - q)).sum(-1)


def top1_rows(reference: Tensor, got: Tensor) -> Tensor:
    return (reference.argmax(-1) == got.argmax(-1)).double()
