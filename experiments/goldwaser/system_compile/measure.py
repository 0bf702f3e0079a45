"""What a model (patched, baked, or neither) does to the queries, against the model given the system prompt:
the next-token KL and top-1 agreement along the prompted model's greedy reply (teacher-forced), and the
behaviour check on the model's own free greedy generation from the query alone, judged with the STOCK model's
likelihood of it (coherence.py): a compiled model's generations are scored by the model it was compiled from,
read through its original weights (`StockView`), never by itself."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.goldwaser.system_compile.coherence import Judge, loglik
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


class StockView:
    """The model with `originals` (parameter name -> the stock tensor) in place of the parameters a compile
    changed, for a forward (torch.func.functional_call): the stock model, while the compiled one stays in place."""

    def __init__(self, model: nn.Module, originals: dict[str, Tensor]):
        self.model, self.originals = model, originals

    def parameters(self):
        return self.model.parameters()

    def __call__(self, **kwargs):
        return torch.func.functional_call(self.model, self.originals, args=(), kwargs=kwargs)


@torch.no_grad()
def teacher_forced(model: nn.Module, ref: Reference, queries: list[int]) -> list[tuple[float, float, int, float]]:
    """Per query: (mean KL(prompted ‖ model), top-1 agreement, positions, the model's mean log-probability of
    the reply) along the prompted model's reply, the model fed the query without the system prompt."""
    rows = []
    for i in queries:
        got = reply_logits(model, ref.ids[i].plain, ref.replies[i])
        rows.append((float(kl_rows(ref.logits[i], got).mean()), float(top1_rows(ref.logits[i], got).mean()),
                     len(ref.replies[i]), loglik(got, ref.replies[i])))
    return rows


def mean_kl(ref: Reference, queries: list[int]) -> Callable[[nn.Module], float]:
    """A model's mean KL over `queries` (indices into `ref`): the bake's curve, a budget point's validation
    score."""

    def measure(model: nn.Module) -> float:
        return sum(row[0] for row in teacher_forced(model, ref, queries)) / len(queries)
    return measure


def measure_model(lm: nn.Module, ref: Reference, gen: Generation, log, generations: list[list[int]] | None = None,
                  **index) -> tuple[list[list[int]], list[float]]:
    """Log kl, top1 and the model's likelihood of the prompted reply (prompted_reply_loglik) per query (split=,
    query=); return the model's free generations and those likelihoods. `generations` (the control's, shared
    by every system prompt) are used instead of generating again. The generations are judged apart
    (`judge_replies`), by the stock model."""
    every = list(range(len(ref.ids)))
    scores = []
    for i, (kl, top1, n, ll) in zip(every, teacher_forced(lm, ref, every), strict=True):
        log("kl", kl, split=ref.splits[i], query=i, positions=n, **index)
        log("top1", top1, split=ref.splits[i], query=i, positions=n, **index)
        log("prompted_reply_loglik", ll, split=ref.splits[i], query=i, **index)
        scores.append(ll)
    if generations is None:
        generations = gen.free(lm, [ids.plain for ids in ref.ids])
    return generations, scores


@torch.no_grad()
def judge_replies(stock, ref: Reference, gen: Generation, judge: Judge, log, replies: list[list[int]],
                  scores: list[float] | None = None, **index) -> dict[str, list[str]]:
    """Log each reply's behaviour (the check's text side and the stock model's likelihood of the reply given the
    query, at or above the judge's threshold) and its likelihood where it was asked (reply_loglik); return the
    decoded replies per split. `stock` is the stock model (or a StockView); `scores` the replies' likelihoods
    when already known (the prompted model's replies: the control's teacher-forced pass gives them)."""
    texts: dict[str, list[str]] = {"fit": [], "heldout": []}
    for i, tokens in enumerate(replies):
        text = gen.decode(tokens)

        def score(i=i, tokens=tokens) -> float:
            if scores is not None:
                return scores[i]
            return loglik(reply_logits(stock, ref.ids[i].plain, tokens), tokens) if tokens else math.nan
        passed, value = judge(text, score)
        log("behaviour", float(passed), split=ref.splits[i], query=i, **index)
        if not math.isnan(value):
            log("reply_loglik", value, split=ref.splits[i], query=i, **index)
        texts[ref.splits[i]].append(text)
    return texts
