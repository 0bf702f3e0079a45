"""What a model (patched, baked, or neither) does to the queries, against the model given the system prompt:
the next-token KL and top-1 agreement along the prompted model's greedy reply (teacher-forced), and the
behaviour check on the model's own free greedy generation from the query alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.goldwaser.system_compile.inputs import QueryIds
from experiments.goldwaser.system_compile.replies import generate, kl_rows, reply_logits, top1_rows


@dataclass
class Reference:
    """For one system prompt: every query's ids, its split, the prompted model's greedy reply and its logits
    along it (the reference every method is measured against)."""

    ids: list[QueryIds]
    splits: list[str]  # "fit" | "heldout"
    replies: list[list[int]]
    logits: list[Tensor]  # (len(reply), V) float32

    def indices(self, split: str) -> list[int]:
        return [i for i, s in enumerate(self.splits) if s == split]


@dataclass(frozen=True)
class Generation:
    """How a run generates: the reply length, the stop tokens, the pad id, how to read a reply."""

    max_new: int
    stop_ids: frozenset[int]
    pad_id: int
    decode: Callable[[list[int]], str]

    def free(self, model: nn.Module, inputs: list[tuple[int, ...]]) -> list[list[int]]:
        return generate(model, inputs, self.max_new, set(self.stop_ids), self.pad_id)


@torch.no_grad()
def teacher_forced(model: nn.Module, ref: Reference, queries: list[int]) -> list[tuple[float, float, int]]:
    """Per query: (mean KL(prompted ‖ model), top-1 agreement, positions) along the prompted model's reply,
    the model fed the query without the system prompt."""
    rows = []
    for i in queries:
        got = reply_logits(model, ref.ids[i].plain, ref.replies[i])
        rows.append((float(kl_rows(ref.logits[i], got).mean()), float(top1_rows(ref.logits[i], got).mean()),
                     len(ref.replies[i])))
    return rows


def mean_kl(ref: Reference, queries: list[int]) -> Callable[[nn.Module], float]:
    """A model's mean KL over `queries` (indices into `ref`): the bake's curve, a budget point's validation
    score."""

    def measure(model: nn.Module) -> float:
        return sum(kl for kl, _, _ in teacher_forced(model, ref, queries)) / len(queries)
    return measure


def measure_model(lm: nn.Module, ref: Reference, gen: Generation, check: Callable[[str], bool], log,
                  generations: list[list[int]] | None = None, **index) -> dict[str, list[str]]:
    """Log kl, top1 and behaviour per query (split=, query=) and return the decoded free generations per split;
    `generations` (the control's, shared by every system prompt) are used instead of generating again."""
    every = list(range(len(ref.ids)))
    for i, (kl, top1, n) in zip(every, teacher_forced(lm, ref, every), strict=True):
        log("kl", kl, split=ref.splits[i], query=i, positions=n, **index)
        log("top1", top1, split=ref.splits[i], query=i, positions=n, **index)
    if generations is None:
        generations = gen.free(lm, [ids.plain for ids in ref.ids])
    texts: dict[str, list[str]] = {"fit": [], "heldout": []}
    for i, tokens in enumerate(generations):
        text = gen.decode(tokens)
        log("behaviour", float(check(text)), split=ref.splits[i], query=i, **index)
        texts[ref.splits[i]].append(text)
    return texts
