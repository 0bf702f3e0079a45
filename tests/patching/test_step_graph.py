"""A whole patched token recorded once and replayed (experiments/patching/step_graph.py): the with-context step on
a static KV cache, the patched pass, the greedy choice written back as the next query. No GPU here:
`eager_capture` replays by running the step again and writing its outputs into the first run's, so what a CUDA
graph's replay depends on is held on the CPU: the step advances by its own device state alone (query, cache
position), the recording's warm-up leaves no trace, the outputs are the static ones, nothing is read back to the
host, and the tokens are the eager dynamic-cache path's in float64. The recording itself needs a GPU (`pytest -m
gpu`, and patch_bench --graphs on in the GPU check)."""

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


def _tokens(model, variant: str, max_new_tokens: int = 5, **kwargs) -> list[int]:
    return [g.token_id for g in patched_generate(Patcher(model, variant), {"input_ids": IDS}, max_new_tokens,
                                                 **kwargs)]


def _warmed_capture(run):
    """As `cuda_capture` runs the step before recording it: WARMUP eager runs that write ahead in the cache and move
    the query on, which the recorded step must put back."""
    for _ in range(step_graph.WARMUP):
        run()
    return step_graph.eager_capture(run)


@pytest.mark.parametrize("capture", [step_graph.eager_capture, _warmed_capture], ids=["eager", "warmed"])
@pytest.mark.parametrize(("name", "variant"), [("tiny-gemma3", "naive"), ("tiny-gemma3", "closed_loop"),
                                               ("tiny-llama", "naive"), ("tiny-gpt2", "closed_loop")])
def test_a_replayed_step_gives_the_eager_tokens(name, variant, capture):
    model = _model(name)
    eager = _tokens(model, variant)
    replayed = _tokens(model, variant, graphs="on", capture=capture)
    assert replayed == eager and len(eager) == 5
    assert _tokens(model, variant, graphs="on", capture=capture, max_new_tokens=1) == eager[:1]


def test_the_replayed_step_is_the_eager_static_cache_step():
    """The recorded step against the same step run eagerly on its own static cache (no recording, no replay):
    the same tokens, and each layer's error against the record (float64 rounding in size) the same to rounding
    (two patchers' buffers sit at other addresses, and MKL's products depend on alignment; naive's Δm on a
    post-norm block divides by near-zero outputs, so its statistics are not compared);
    and a recording whose replay did not move the query on (a fault) repeats itself, so the check can fail."""
    model = _model("tiny-gemma3")
    replayed = step_graph.GraphedStep(Patcher(model, "naive"), {"input_ids": IDS}, 4, step_graph.eager_capture)
    plain = step_graph.GraphedStep(Patcher(model, "naive"), {"input_ids": IDS}, 4,
                                   lambda run: (lambda: None, (torch.zeros((), dtype=torch.long), torch.zeros(1))))
    for _ in range(4):
        token = replayed()
        want, vector = plain._run()
        assert torch.equal(token, want)
        errors = 2 * len(replayed.patcher.layers)  # the vector's head: each layer's error against the record
        assert (replayed.vector[:errors] - vector[:errors]).abs().max() < 1e-10  # both ~1e-13: rounding
    stuck = step_graph.GraphedStep(Patcher(model, "naive"), {"input_ids": IDS}, 4, step_graph.eager_capture)
    stuck.query.copy_ = lambda t: stuck.query  # the fault: the chosen token never becomes the next query
    tokens = [int(stuck()) for _ in range(3)]
    assert tokens != _tokens(model, "naive")[:3]


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


def test_a_recorded_step_chooses_greedily():
    patcher = Patcher(_model("tiny-llama"), "naive")
    with pytest.raises(ValueError, match="chooses greedily"):
        list(patched_generate(patcher, {"input_ids": IDS}, 2, choose=lambda logits: 0, graphs="auto"))


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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-gpt2"])
def test_a_static_caches_size_from_the_config_is_what_transformers_allocates(name):
    """`static_cache_bytes` (the config alone) against the keys and values transformers' StaticCache holds once a
    forward has filled it; Gemma 3's sliding layers past their window as well."""
    from transformers import StaticCache

    from experiments.patching.patcher import _cache_name

    model = load_checked(name, torch.float32, "cpu", seed=0).model
    window = getattr(model.config, "sliding_window", None) or 8
    for length in (12, window + 7):
        cache = StaticCache(config=model.config, max_cache_len=length)
        model(input_ids=IDS[:, :3], **{_cache_name(model): cache}, use_cache=True)
        held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        assert step_graph.static_cache_bytes(model.config, length, 4) == held


def test_a_static_cache_that_does_not_fit_is_refused_in_one_line_or_left_to_the_eager_step(monkeypatch, caplog):
    model = _model("tiny-llama")
    eager = _tokens(model, "naive", 3)
    monkeypatch.setattr(step_graph, "available_bytes", lambda device: 1000)
    with pytest.raises(UserError, match=r"^graphs=on: a static KV cache of 11 tokens needs 0\.0 GiB and 0\.0 GiB "
                                        r"are free on cpu: shorten the prompt or max_new_tokens, or use graphs=off$"):
        _tokens(model, "naive", 3, graphs="on", capture=step_graph.eager_capture)
    with caplog.at_level("WARNING"):
        assert _tokens(model, "naive", 3, graphs="auto", capture=step_graph.eager_capture) == eager
    assert "graphs=auto: a static KV cache of 11 tokens needs" in caplog.text
