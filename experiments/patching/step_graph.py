"""The patched pass as one CUDA graph, replayed token after token (issue 54: a token at the GPU's speed).

A patched token's work is thousands of small operations (the patches of every layer, then the model's own
forward of the query alone), each a kernel launch from Python: on an H200 the time is the host's per-operation
cost, not the card's (docs/benchmarks.md). The pass has a fixed shape (the query alone, no cache) and, once its
mask is given whole and its statistics wait on the device (`Patcher.query_mask`, `patched_pass(defer=True)`),
it reads nothing back to the host; so it can be recorded once as a CUDA graph and replayed: one launch a token.

What changes from one token to the next are the pass's inputs only: the query token and the with-context
step's per-layer targets and record. They are copied into static buffers (one `_foreach_copy_`) before each
replay; the pass reads them there, and its logits and its deferred values land in static outputs, which are
cloned where they must outlive the next replay. The with-context step stays eager (its KV cache grows).

`capture` is how the pass is recorded: `cuda_capture` on a GPU; `eager_capture` runs the same plumbing on any
device by re-running the pass eagerly into the same static outputs, so a CPU test holds what a GPU's replay
depends on (every input reaches the pass through its static buffer, the outputs are the static ones, no read
back to the host), though not the recording itself, which only a GPU can do.

`graphs=auto` records where it can: a CUDA device, and a block without a router (an MoE's expert dispatch reads
which experts fired back to the host, which a graph cannot hold); a recording that fails falls back to the eager
pass with one line. `graphs=on` refuses, in one line, where it cannot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from experiments.core.errors import UserError
from experiments.patching.capture import LayerCapture
from experiments.patching.patcher import ContextStep

log = logging.getLogger(__name__)

GRAPHS = ("auto", "on", "off")
WARMUP = 2  # eager runs on a side stream before recording (cuBLAS workspaces, lazy inits), as torch's docs ask

Run = Callable[[], Tensor]
# (the pass on the static inputs, the patcher's deferred queue) -> (replay, static logits, (take, static vector))
Capture = Callable[[Run, list], tuple[Callable[[], None], Tensor, tuple]]


def why_no_graphs(patcher, device: torch.device) -> str | None:
    """Why the patched pass cannot be recorded as a CUDA graph here, or None where it can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (the model is on {device.type})"
    if not hasattr(torch.cuda, "CUDAGraph"):
        return f"this torch ({torch.__version__}) has no CUDA graphs"
    if "router" in patcher.adapter.captures:
        return (f"{patcher.adapter.family}: an MoE's expert dispatch reads which experts fired back to the host, "
                "which a CUDA graph cannot hold")
    return None


def check_graphs(graphs: str) -> str:
    if graphs not in GRAPHS:
        raise UserError(f"graphs={graphs!r}: one of {', '.join(GRAPHS)}")
    return graphs


def use_graphs(patcher, graphs: str, device: torch.device) -> bool:
    """Whether to record the patched pass: `on` where it can (else a one-line refusal), `auto` where it can,
    `off` never."""
    why = why_no_graphs(patcher, device) if check_graphs(graphs) != "off" else None
    if graphs == "on" and why:
        raise UserError(f"graphs=on: {why}; use graphs=auto (records where it can) or graphs=off")
    return graphs != "off" and why is None


def cuda_capture(run: Run, deferred: list) -> tuple[Callable[[], None], Tensor, tuple]:
    """Record `run` as a CUDA graph after WARMUP eager runs on a side stream (their deferred values are real
    ones and stay queued); the recording's own deferred entry is the static vector every replay refills."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = run()
    return graph.replay, logits, deferred.pop()


def eager_capture(run: Run, deferred: list) -> tuple[Callable[[], None], Tensor, tuple]:
    """A replay by running the pass again eagerly into the same static outputs, as a graph's replay writes
    them: the plumbing of `cuda_capture` on any device."""
    logits = run()
    take, vector = deferred.pop()

    def replay() -> None:
        logits.copy_(run())
        vector.copy_(deferred.pop()[1])

    return replay, logits, (take, vector)


class GraphedPass:
    """`patcher.patched_pass(query, step, defer=True)`'s logits, the pass recorded once and replayed."""

    def __init__(self, patcher, capture: Capture = cuda_capture):
        self.patcher = patcher
        self.capture = capture
        self.static = None  # (query, each layer's target values, each layer's record): the replay's inputs
        self.replay = None

    def __call__(self, query: Tensor, step) -> Tensor:
        inputs = (query, [t.values for t in step.targets], list(step.record))
        if self.replay is None:
            self.static = tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, inputs)
            self.replay, self.logits, (self.take, self.vector) = self.capture(self._run, self.patcher._deferred)
        self._copy_in(inputs)
        self.replay()
        self.patcher._deferred.append((self.take, self.vector.clone()))  # the next replay overwrites it
        return self.logits

    def _copy_in(self, inputs) -> None:
        new, spec = tree_flatten(inputs)
        static, static_spec = tree_flatten(self.static)
        if spec != static_spec:  # a target that appeared or vanished: the recording no longer fits the step
            raise RuntimeError("the with-context step's targets changed shape since the pass was recorded")
        pairs = [(s, n) for s, n in zip(static, new, strict=True) if isinstance(s, Tensor)]
        torch._foreach_copy_([s for s, _ in pairs], [n for _, n in pairs])

    def _run(self) -> Tensor:
        query, values, record = self.static
        step = ContextStep(None, [LayerCapture(v) for v in values], record, None)
        return self.patcher.patched_pass(query, step, defer=True).logits


def graphed_or_eager(patcher, graphs: str, device: torch.device,
                     capture: Capture | None = None) -> Callable[[Tensor, object], Tensor]:
    """The patched pass's logits for (query, step): recorded where `graphs` asks and it can, else eager. A
    recording that fails falls back to the eager pass with one line (graphs=auto), or raises (graphs=on).
    `capture`: how the pass is recorded; by default a CUDA graph where this device and block allow one
    (`why_no_graphs`); `eager_capture` runs the same plumbing anywhere (tests)."""

    def eager(query: Tensor, step) -> Tensor:
        return patcher.patched_pass(query, step, defer=True).logits

    if capture is None:
        if not use_graphs(patcher, graphs, device):
            return eager
        capture = cuda_capture
    elif check_graphs(graphs) == "off":
        return eager
    graphed = GraphedPass(patcher, capture)
    state = {"pass": graphed}

    def run(query: Tensor, step) -> Tensor:
        try:
            return state["pass"](query, step)
        except RuntimeError as err:  # torch.cuda's errors are RuntimeErrors
            if graphs == "on" or state["pass"] is not graphed:
                raise
            log.warning("graphs=auto: recording the patched pass failed (%s); the eager pass runs instead",
                        (str(err).splitlines() or [type(err).__name__])[0])
            state["pass"] = eager
            return eager(query, step)

    return run
