"""The whole patched token compiled (step_graph.py, `compile=`): traced here by torch.compile's eager backend (no
code generated, so no C compiler and no minutes of compilation on a CPU test), it gives the eager tokens and is
compiled once; the bad inputs are refused in one line, and `auto` compiles on a GPU only. Inductor's code and its
CUDA graphs (`mode="reduce-overhead"`) run in `pytest -m gpu` and patch_bench --step-compile on."""

from __future__ import annotations

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching import step_graph
from experiments.patching.generate import patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher

IDS = torch.tensor([[5, 6, 7, 8, 9, 10]])


def _tokens(model, variant: str, n: int = 5, **kwargs) -> list[int]:
    return [g.token_id for g in patched_generate(Patcher(model, variant), {"input_ids": IDS}, n, **kwargs)]


@pytest.mark.parametrize("model_name, variant, batch_layers", [
    ("tiny-llama", "naive", "off"), ("tiny-llama", "closed_loop", "off"), ("tiny-gemma3", "conditioned", "off"),
    ("tiny-llama", "naive", "on")])
def test_a_compiled_step_gives_the_eager_tokens_and_compiles_once(model_name, variant, batch_layers):
    """What torch.compile traced is the step: the eager tokens (float64), from graphs compiled by the first token
    alone, without a break: no hook registered per pass (taps.py), no forward swapped, nothing of the pass in a
    list that grows. Gemma 3's sliding-window cache keeps its count as a Python int as well, which a replay must not
    have moved (`GraphedStep._host_counts`) and which torch.compile makes dynamic at its second value: two graphs,
    both compiled before the first token is out. Batched (`batch_layers=on`: the input updates stacked, the alone
    passes one vmap) the same, the stack's check of its slots answered by the eager run before the trace."""
    from torch._dynamo.utils import counters

    model = load_checked(model_name, torch.float64, "cpu", seed=0).model
    eager = _tokens(model, variant)
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    try:
        run = patched_generate(Patcher(model, variant, batch_layers=batch_layers), {"input_ids": IDS}, 5, compile="on",
                               capture=step_graph.compiled_capture(backend="eager"))
        tokens = []
        for g in run:
            tokens.append(g.token_id)
            graphs.append(counters["stats"]["unique_graphs"])
        breaks = dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert tokens == eager and len(eager) == 5
    assert graphs[0] >= 1  # it was compiled, not run eagerly
    assert graphs == [graphs[0]] * 5  # and not again after the first token
    assert not breaks, breaks


def test_compile_on_without_a_compiler_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(step_graph, "compile_missing", lambda device_type: "a C compiler (gcc or clang on PATH)")
    with pytest.raises(UserError, match=r"^compile=on: torch.compile on cpu needs a C compiler") as err:
        step_graph.use_compile("on", torch.device("cpu"))
    assert "\n" not in str(err.value)
    assert step_graph.use_compile("auto", torch.device("cuda")) is False  # auto: uncompiled where it cannot
    monkeypatch.setattr(step_graph, "compile_missing", lambda device_type: None)
    assert step_graph.use_compile("auto", torch.device("cuda")) is True  # compiled on a GPU that can
    assert step_graph.use_compile("auto", torch.device("cpu")) is False  # not on the CPU
    assert step_graph.use_compile("on", torch.device("cpu")) is True
    with pytest.raises(UserError, match="compile='yes': one of auto, on, off"):
        step_graph.use_compile("yes", torch.device("cpu"))


def test_a_failed_compilation_under_auto_falls_back_to_the_eager_step(monkeypatch, caplog):
    """compile=auto on a GPU that cannot compile the step: one line, and the eager loop's tokens (simulated on the
    CPU: the compiler's failure raised by the capture)."""
    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model

    def failing(run):
        raise RuntimeError("inductor: no kernel for this\nmore lines")

    eager = _tokens(model, "naive")
    with caplog.at_level("WARNING"):
        assert _tokens(model, "naive", compile="auto", capture=failing) == eager
    assert "compile=auto: compiling the patched step failed (inductor: no kernel for this)" in caplog.text
    with pytest.raises(RuntimeError, match="no kernel"):
        _tokens(model, "naive", compile="on", capture=failing)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["naive", "closed_loop"])
def test_the_step_compiled_by_inductor_on_a_gpu_gives_the_eager_tokens_once_compiled(variant):
    """On a GPU machine (pytest -m gpu): inductor's kernels in CUDA graphs (compile=on with graphs=on:
    reduce-overhead), float32, against the eager step on the same card; no graph compiled after the first token.
    Fused kernels round sums in another order, so this holds where the tiny model's top logits are apart (they
    are: the CUDA graph test's tokens)."""
    from torch._dynamo.utils import counters

    model = load_checked("tiny-llama", torch.float32, "cuda", seed=0).model
    ids = IDS.to("cuda")
    eager = [g.token_id for g in patched_generate(Patcher(model, variant), {"input_ids": ids}, 6)]
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    try:
        for g in patched_generate(Patcher(model, variant), {"input_ids": ids}, 6, graphs="on", compile="on"):
            graphs.append((g.token_id, counters["stats"]["unique_graphs"]))
    finally:
        torch._dynamo.reset()
    assert [t for t, _ in graphs] == eager
    assert graphs[0][1] >= 1 and {n for _, n in graphs} == {graphs[0][1]}
