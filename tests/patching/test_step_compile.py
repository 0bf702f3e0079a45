"""The whole patched token compiled (step_graph.py, `compile=`): traced here by torch.compile's eager backend (no
code generated, so no C compiler and no minutes of compilation on a CPU test), it gives the eager tokens; the bad
inputs are refused in one line, and `auto` compiles nowhere yet (step_graph.py: the step is compiled again every
token until its hooks are placed once). Inductor's code and its CUDA graphs
(`mode="reduce-overhead"`) run on a GPU only (`pytest -m gpu`, patch_bench --step-compile on)."""

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


@pytest.mark.parametrize("variant", ["naive"])
def test_a_compiled_step_gives_the_eager_tokens(variant):
    """What torch.compile traced is the step: the eager tokens (float64). It compiles, but not once: a frame a token
    is compiled again (hooks registered every pass; step_graph.py), which this measures and does not hide."""
    from torch._dynamo.utils import counters

    model = load_checked("tiny-llama", torch.float64, "cpu", seed=0).model
    eager = _tokens(model, variant)
    torch._dynamo.reset()
    counters.clear()
    try:
        run = patched_generate(Patcher(model, variant), {"input_ids": IDS}, 5, compile="on",
                               capture=step_graph.compiled_capture(backend="eager"))
        tokens = [g.token_id for g in run]
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert tokens == eager and len(eager) == 5
    assert graphs >= 1  # it was compiled, not run eagerly


def test_compile_on_without_a_compiler_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(step_graph, "compile_missing", lambda device_type: "a C compiler (gcc or clang on PATH)")
    with pytest.raises(UserError, match=r"^compile=on: torch.compile on cpu needs a C compiler") as err:
        step_graph.use_compile("on", torch.device("cpu"))
    assert "\n" not in str(err.value)
    assert step_graph.use_compile("auto", torch.device("cpu")) is False  # auto compiles nowhere yet
    monkeypatch.setattr(step_graph, "compile_missing", lambda device_type: None)
    assert step_graph.use_compile("auto", torch.device("cuda")) is False
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
