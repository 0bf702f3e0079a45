"""The patched pass recorded once and replayed (experiments/patching/step_graph.py). No GPU here: `eager_capture`
replays by running the pass again into the same static outputs, so what a CUDA graph's replay depends on is held
on the CPU: every input reaches the pass through its static buffer (the logits, tokens and deferred statistics
are the eager path's, bit for bit, in float64), the outputs are the static ones, nothing is read back to the host.
The recording itself needs a GPU (`pytest -m gpu`, and patch_bench --graphs on in the GPU check)."""

from __future__ import annotations

import pytest
import torch

from experiments.core.errors import UserError
from experiments.core.op_count import count_ops
from experiments.patching import step_graph
from experiments.patching.generate import patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher

IDS = torch.tensor([[5, 6, 7, 8, 9, 10]])


def _model(name: str):
    return load_checked(name, torch.float64, "cpu", seed=0).model


def _tokens(model, variant: str, **kwargs) -> list[int]:
    return [g.token_id for g in patched_generate(Patcher(model, variant), {"input_ids": IDS}, 5, **kwargs)]


@pytest.mark.parametrize(("name", "variant"), [("tiny-gemma3", "naive"), ("tiny-gemma3", "closed_loop"),
                                               ("tiny-llama", "naive"), ("tiny-gpt2", "closed_loop")])
def test_a_replayed_pass_gives_the_eager_tokens(name, variant):
    model = _model(name)
    eager = _tokens(model, variant)
    replayed = _tokens(model, variant, graphs="on", capture=step_graph.eager_capture)
    assert replayed == eager and len(eager) == 5


def test_each_replay_reads_its_own_inputs():
    """The control: a recording that keeps its first token's targets (no copy into the static buffers) gives
    other logits on the next tokens, so the check above can fail."""
    model = _model("tiny-gemma3")
    patcher = Patcher(model, "naive")
    cache, query = patcher.start({"input_ids": IDS})
    graphed = step_graph.GraphedPass(patcher, step_graph.eager_capture)
    steps = []
    for _ in range(3):
        step = patcher.context_step({"input_ids": query}, cache)
        cache = step.cache
        steps.append(step)
        assert torch.equal(graphed(query, step), patcher.patched_pass(query, step, defer=True).logits)
        eager_values, replayed_values = patcher._deferred[-1][1], patcher._deferred[-2][1]
        assert torch.equal(replayed_values, eager_values)  # per-layer errors, statistics, checks: the same bits
        query = graphed.logits.argmax().reshape(1, 1)
    graphed._copy_in = lambda inputs: None  # a fault: the static buffers keep the last token's inputs
    step = patcher.context_step({"input_ids": query}, cache)
    assert not torch.equal(graphed(query, step), patcher.patched_pass(query, step).logits)
    patcher.read_deferred()


def test_a_replayed_token_reads_nothing_back():
    patcher = Patcher(_model("tiny-llama"), "naive")
    run = patched_generate(patcher, {"input_ids": IDS}, 5, graphs="on", capture=step_graph.eager_capture)
    next(run), next(run)  # the first records, the second replays once
    with count_ops() as count:
        next(run), next(run)
    list(run)
    assert count.host_reads == 0


def test_a_failed_check_of_a_replay_still_raises():
    """The value checks of every replay are read at the end: a replay whose check flag is set raises there."""
    patcher = Patcher(_model("tiny-llama"), "naive")
    run = patched_generate(patcher, {"input_ids": IDS}, 3, graphs="on", capture=step_graph.eager_capture)
    next(run), next(run)
    take, vector = patcher._deferred[-1]
    vector[-1] = 1.0  # the last value is a check's flag (y = 0, say): set, as a zero input would set it
    with pytest.raises(ValueError, match="is undefined"):
        list(run)


@pytest.mark.parametrize(("graphs", "refused"), [("on", "graphs=on: CUDA graphs need a CUDA device"),
                                                 ("sometimes", "graphs='sometimes': one of auto, on, off")])
def test_graphs_that_cannot_be_are_refused_in_one_line(graphs, refused):
    patcher = Patcher(_model("tiny-llama"), "naive")
    with pytest.raises(UserError, match=refused) as err:
        step_graph.use_graphs(patcher, graphs, torch.device("cpu"))
    assert "\n" not in str(err.value)
    assert step_graph.use_graphs(patcher, "auto", torch.device("cpu")) is False  # auto: eager here


def test_an_moe_block_is_never_recorded():
    patcher = Patcher(_model("tiny-mixtral"), "naive")
    why = step_graph.why_no_graphs(patcher, torch.device("cuda"))
    assert why and "MoE" in why


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["naive", "closed_loop"])
def test_a_cuda_graph_of_the_pass_gives_the_eager_tokens_on_a_gpu(variant):
    """On a GPU machine (pytest -m gpu): the pass recorded as a real CUDA graph and replayed, against the eager
    pass, float32 on the same card; and recording is what ran (no fallback to the eager pass)."""
    bundle = load_checked("tiny-llama", torch.float32, "cuda", seed=0)
    ids = IDS.to("cuda")
    eager = [g.token_id for g in patched_generate(Patcher(bundle.model, variant), {"input_ids": ids}, 6)]
    patcher = Patcher(bundle.model, variant)
    replayed = [g.token_id for g in patched_generate(patcher, {"input_ids": ids}, 6, graphs="on")]
    assert replayed == eager
