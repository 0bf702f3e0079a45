"""Patched generation reads nothing back to the host once warmed (issue 54): the chosen token stays on the device
as the next query, the query-alone pass's mask is given whole, and the passes' statistics and value checks wait
on the device for one read at the end. Counted by the dispatcher (experiments/core/op_count.py), so the count
does not depend on the machine. What transformers' own forward reads is named apart: GPT-2's padding warning
check of the with-context step, and an MoE's expert dispatch."""

from __future__ import annotations

import pytest
import torch

from experiments.core.op_count import count_ops
from experiments.patching.families import tiny_models
from experiments.patching.generate import patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher

IDS = torch.tensor([[5, 6, 7, 8, 9, 10]])
# transformers' own reads in the with-context step (not ours to remove): GPT-2 checks every call whether the
# input looks padded (`warn_if_padding_and_no_attention_mask`)
CONTEXT_READS = {"tiny-gpt2": 1}
MOE = "tiny-mixtral"  # its experts are dispatched by which ones fired: transformers reads the routing


def _reads(patcher: Patcher, tokens: int = 3) -> tuple[float, float]:
    """(with-context step, the rest) host reads per token, after a first token that warms the caches."""
    context_step, context = patcher.context_step, []

    def counted(*args, **kwargs):
        with count_ops() as count:
            out = context_step(*args, **kwargs)
        context.append(count.host_reads)
        return out

    patcher.context_step = counted
    run = patched_generate(patcher, {"input_ids": IDS}, tokens + 1)
    next(run)
    context.clear()
    with count_ops() as total:
        for _ in range(tokens):
            next(run)
    list(run)  # the end: the one read of every deferred pass
    return sum(context) / tokens, (total.host_reads - sum(context)) / tokens


@pytest.mark.parametrize("name", [n for n in tiny_models() if n != MOE])
@pytest.mark.parametrize("variant", ["naive", "closed_loop"])
def test_a_warmed_token_reads_nothing_back(name, variant):
    patcher = Patcher(load_checked(name, torch.float64, "cpu", seed=0).model, variant)
    assert patcher.query_mask()  # every dense family takes the whole mask
    context, rest = _reads(patcher)
    assert rest == 0
    assert context == CONTEXT_READS.get(name, 0)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])  # input updates stacked and alone passes grouped
def test_a_warmed_batched_token_reads_nothing_back(name):
    """batch_layers=on, what a GPU runs (`auto`): the stacks' slot checks and the grouped alone passes read
    nothing back to the host either."""
    patcher = Patcher(load_checked(name, torch.float64, "cpu", seed=0).model, "naive", batch_layers="on")
    assert patcher.batched
    context, rest = _reads(patcher)
    assert rest == 0
    assert context == CONTEXT_READS.get(name, 0)


def test_the_count_sees_a_read_per_token():
    """The check above can fail: a greedy choice read back with int(), as before, is one read a token."""
    patcher = Patcher(load_checked("tiny-llama", torch.float64, "cpu", seed=0).model, "naive")
    run = patched_generate(patcher, {"input_ids": IDS}, 4, choose=lambda logits: int(logits.argmax()))
    next(run)
    with count_ops() as count:
        next(run), next(run), next(run)
    assert count.host_reads == 3


def test_deferred_values_are_the_values_read_at_once():
    """A deferred pass's per-layer errors and statistics, read at the end, are the ones a pass reads at once;
    and its tokens are the tokens of the reading path."""
    model = load_checked("tiny-gemma3", torch.float64, "cpu", seed=0).model
    patcher = Patcher(model, "stable")
    cache, query = patcher.start({"input_ids": IDS})
    step = patcher.context_step({"input_ids": query}, cache)
    now = patcher.patched_pass(query, step)
    later = patcher.patched_pass(query, step, defer=True)
    assert later.hidden_linf == [] and patcher._deferred
    patcher.read_deferred()
    assert later.hidden_linf == now.hidden_linf and later.hidden_rel == now.hidden_rel
    assert [vars(s) for s in later.layer_stats] == [vars(s) for s in now.layer_stats]
    assert torch.equal(later.logits, now.logits)
    deferred = [g.token_id for g in patched_generate(Patcher(model, "stable"), {"input_ids": IDS}, 4)]
    read = [g.token_id for g in patched_generate(Patcher(model, "stable"), {"input_ids": IDS}, 4,
                                                 choose=lambda logits: int(logits.argmax()))]
    assert deferred == read


def test_a_family_that_reads_positions_from_the_mask_gets_none(tmp_path):
    """OPT computes its learned positions from the 2-D mask's cumulative sum: a whole 4-D mask breaks its forward,
    so the patcher asks once and gives none (and the pass reads as transformers does)."""
    from experiments.patching.arch import tiny

    folder = tiny.save_checkpoint("opt", tmp_path / "opt")
    patcher = Patcher(load_checked(str(folder), torch.float64, "cpu", seed=0).model, "closed_loop")
    assert patcher.query_mask() == {}
