"""A whole patched token as one CUDA graph, replayed token after token (issue 54: a token at the GPU's speed).

A patched token's work is thousands of small operations (the with-context step, the patches of every layer, the
model's own forward of the query alone), each a kernel launch from Python: on an H200 the time is the host's
per-operation cost, not the card's (docs/benchmarks.md). Once nothing of it is read back to the host (the query-
alone pass's mask given whole, its statistics and checks left on the device: `Patcher.query_mask`,
`patched_pass(defer=True)`) and the with-context step runs on a static KV cache, a token has fixed shapes and
fixed addresses, and depends on the one before only through device state (the query, the cache and its write
position). So it is recorded once (`GraphedStep`) and replayed: one launch a token; the greedy choice is written
back as the next query inside the recording.

`capture` is how the step is recorded: `cuda_capture` on a GPU; `eager_capture` runs the same plumbing on any
device by running the step again eagerly into the same static outputs, so a CPU test holds what a GPU's replay
depends on (the step moves on by its own device state alone, the recording's warm-up leaves no trace, the outputs
are the static ones, nothing is read back to the host), though not the recording itself, which only a GPU can do.

`graphs=auto` records where it can: a CUDA device, and a block without a router (an MoE's expert dispatch reads
which experts fired back to the host, which a graph cannot hold); a recording that fails falls back to the eager
step with one line (GPT-2's forward, for one, checks its input for padding on the host). `graphs=on` refuses, in
one line, where it cannot.

`compile=on` compiles the same step with `torch.compile` (`compiled_capture`; with graphs on a GPU as
`mode="reduce-overhead"`, inductor's own CUDA graphs): the operations fused into fewer kernels, not only launched at
once. It compiles once: the hooks a pass reads through are placed once (taps.py) by one eager run before the
compilation, the closed loop's solve is placed on each layer once instead of swapping forwards every pass, a
pass's values go into a list of the step's own, and a sliding-window cache's Python count is put back with the
device state (`_host_counts`); so the first token's graphs serve every token after it, without a graph break (a
test: tiny Llama naive and closed_loop, tiny Gemma 3 conditioned, torch.compile's eager backend). `compile=auto`
compiles on a GPU where torch.compile has Triton; on the CPU it runs uncompiled with one line (compiling a whole
patched token takes minutes there; `on` compiles it anyway); a compilation that fails falls back to the
eager step with one line (auto) or raises (on). `compile=on` without Triton (CUDA) or a C compiler: refused in one
line. A static cache that does not fit beside the model (`cache_too_large`): refused in one line under `on`, the
eager step under `auto` (one line).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from experiments.core.errors import UserError
from experiments.core.gpu_rates import compile_missing
from experiments.zoo.loading import available_bytes

log = logging.getLogger(__name__)

GRAPHS = ("auto", "on", "off")
COMPILE = ("auto", "on", "off")
WARMUP = 2  # eager runs on a side stream before recording (cuBLAS workspaces, lazy inits), as torch's docs ask

Run = Callable[[], tuple[Tensor, ...]]  # a recorded computation: its outputs, fresh tensors each eager run
Capture = Callable[[Run], tuple[Callable[[], None], tuple[Tensor, ...]]]  # -> (replay, its static outputs)


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


def static_cache_bytes(config, length: int, width: int) -> int:
    """A static KV cache of `length` tokens in elements of `width` bytes: keys and values of every layer, a
    sliding-window layer's no longer than its window. From the model's config alone (transformers' standard names,
    which every config maps its own onto)."""
    cfg = getattr(config, "text_config", None) or config
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    window = getattr(cfg, "sliding_window", None)
    kinds = getattr(cfg, "layer_types", None) or ["full_attention"] * layers
    slots = sum(min(length, window) if kind == "sliding_attention" and window else length for kind in kinds)
    return 2 * kv_heads * head_dim * slots * width


def cache_too_large(patcher, length: int, device: torch.device) -> str | None:
    """Why a static cache of `length` tokens cannot be allocated beside the loaded model (one line), or None."""
    width = next(patcher.model.parameters()).element_size()
    need, free = static_cache_bytes(patcher.model.config, length, width), available_bytes(device)
    if need <= free:
        return None
    return (f"a static KV cache of {length} tokens needs {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are "
            f"free on {device.type}: shorten the prompt or max_new_tokens")


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


def check_compile(compile: str) -> str:
    if compile not in COMPILE:
        raise UserError(f"compile={compile!r}: one of {', '.join(COMPILE)}")
    return compile


def use_compile(compile: str, device: torch.device) -> bool:
    """Whether to compile the step: `on` where torch.compile has what it needs (else a one-line refusal), `auto` on
    a GPU where it has (elsewhere one line, and the step runs uncompiled), `off` never."""
    if check_compile(compile) == "off":
        return False
    missing = compile_missing(device.type)
    if compile == "on":
        if missing:
            raise UserError(f"compile=on: torch.compile on {device.type} needs {missing}; use compile=auto or "
                            "compile=off")
        return True
    if device.type != "cuda" or missing:
        log.info("compile=auto: the patched step runs uncompiled here (%s); compile=on compiles it anyway",
                 f"torch.compile on {device.type} needs {missing}" if missing
                 else "compiled on a GPU only: compiling a whole patched token takes minutes on a CPU")
        return False
    return True


def compiled_capture(mode: str | None = None, backend: str = "inductor") -> Capture:
    """A Capture that runs the step once eagerly (its hooks placed, what reads its values made: `GraphedStep._run`),
    compiles it (`torch.compile`) and runs it WARMUP times (the compilation, and reduce-overhead's CUDA graph
    recording), then once for its outputs; a replay runs the compiled step and
    writes its outputs into those. `backend="eager"` traces without generating code (tests)."""
    def capture(run: Run) -> tuple[Callable[[], None], tuple[Tensor, ...]]:
        run()  # once eagerly first, so what a pass places once (taps.py, the query's call arguments) is in place
        compiled = torch.compile(run, mode=mode, backend=backend, dynamic=None)
        for _ in range(WARMUP):
            compiled()
        outputs = tuple(t.clone() for t in compiled())

        def replay() -> None:
            for static, new in zip(outputs, compiled(), strict=True):
                static.copy_(new)

        return replay, outputs

    return capture


def cuda_capture(run: Run) -> tuple[Callable[[], None], tuple[Tensor, ...]]:
    """Record `run` as a CUDA graph, after WARMUP eager runs on a side stream; (replay, the recording's outputs,
    which every replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run()
    return graph.replay, outputs


def eager_capture(run: Run) -> tuple[Callable[[], None], tuple[Tensor, ...]]:
    """A replay by running `run` again eagerly and writing its outputs into the first run's, as a graph's replay
    rewrites them: the plumbing of `cuda_capture` on any device."""
    outputs = run()

    def replay() -> None:
        for static, new in zip(outputs, run(), strict=True):
            static.copy_(new)

    return replay, outputs


class GraphedStep:
    """A whole patched token recorded once: the with-context step on a static KV cache, the patched pass, and the
    greedy choice, which becomes the next query in place; one replay a token, nothing between them but the
    replay. The prompt is prefilled eagerly into the same cache, which holds WARMUP slots more than the tokens
    asked for (the warm-up runs and the recording, compiled: and an eager run before them, write up to WARMUP + 1
    slots past the first token's, at most the last of them, before the state is put back). The static cache's
    attention runs over all its slots, the later ones masked: the with-context values are the dynamic cache's
    to rounding, not bit for bit (float64: 1e-15 on the tiny models)."""

    def __init__(self, patcher, inputs: dict, max_new_tokens: int, capture: Capture = cuda_capture):
        from transformers import StaticCache

        self.patcher = patcher
        ids = inputs["input_ids"]
        n = ids.shape[1]
        self.cache = StaticCache(config=patcher.model.config, max_cache_len=n + max_new_tokens + WARMUP)
        if n > 1:
            patcher.prefill(patcher.prompt_prefix(inputs), self.cache,
                            cache_position=torch.arange(n - 1, device=ids.device))
        self.query = ids[:, -1:].clone()
        self.position = torch.tensor([n - 1], device=ids.device)
        state = self._device_state()
        first = [t.clone() for t in state]
        counted = self._host_counts()
        self.replay, (self.token, self.vector) = capture(self._run)
        # the warm-up and recording runs wrote the first token's keys and moved the step on: back to the start
        # (the first replay writes the same cache slot again)
        torch._foreach_copy_(state, first)
        for layer, count in counted:
            layer.cumulative_length_int = count

    def _device_state(self) -> list[Tensor]:
        """What a step moves on, in place on the device: the query, its position, and each cache layer's own
        count of what it holds (transformers from 5.2x keeps the write position in the layer, a device tensor
        advanced in place, and reads positions from it; earlier ones take `cache_position`)."""
        counts = [c for layer in getattr(self.cache, "layers", [])
                  if isinstance(c := getattr(layer, "cumulative_length", None), Tensor)]
        return [self.query, self.position, *counts]

    def _host_counts(self) -> list[tuple[object, int]]:
        """A sliding-window cache layer's count, kept as a Python int beside the device one (transformers 5.x): the
        runs before the first token move it as they move the device state, so it is put back with it (a compiled
        step reads it; a CUDA graph's replay never moves it, and it must stay short of the layer's full branch)."""
        return [(layer, layer.cumulative_length_int) for layer in getattr(self.cache, "layers", [])
                if isinstance(getattr(layer, "cumulative_length_int", None), int)]

    def _run(self) -> tuple[Tensor, Tensor]:
        patcher = self.patcher
        step = patcher.context_step({"input_ids": self.query, "cache_position": self.position}, self.cache,
                                    logits=False)
        queue: list = []
        token = patcher.patched_pass(self.query, step, defer=queue).logits.argmax()
        take, vector = queue[0]
        if take is not None:  # None compiled (PatchedPass.finish): compiled_capture's eager first run's stays
            self.take = take
        self.query.copy_(token.view(1, 1))
        self.position.add_(1)
        return token, vector

    def __call__(self) -> Tensor:
        """The next token (0-d, on the device) of a replay."""
        self.replay()
        self.patcher._deferred.append((self.take, self.vector.clone()))
        return self.token.clone()


def recorded_step(patcher, graphs: str, inputs: dict, max_new_tokens: int, capture: Capture | None = None,
                  compile: str = "off") -> GraphedStep | None:
    """The whole token recorded (`GraphedStep`) where `graphs` or `compile` asks and it can, else None (the eager
    loop). A recording or compilation that fails gives None with one line (auto), or raises (on). `capture`: how
    it is recorded; by default compiled where `compile` says (`use_compile`; as reduce-overhead where graphs are
    also wanted and allowed), else a CUDA graph where this device and block allow one (`why_no_graphs`);
    `eager_capture` and `compiled_capture(backend="eager")` run the same plumbing anywhere (tests)."""
    device = inputs["input_ids"].device
    asked = "compile" if check_compile(compile) != "off" else "graphs"
    if capture is None:
        graphed = use_graphs(patcher, graphs, device)
        if use_compile(compile, device):
            capture = compiled_capture("reduce-overhead" if graphed else None)
        elif graphed:
            asked, capture = "graphs", cuda_capture
        else:
            return None
    elif check_graphs(graphs) == "off" and compile == "off":
        return None
    if max_new_tokens < 1:
        return None
    strict = (compile if asked == "compile" else graphs) == "on"
    why = cache_too_large(patcher, inputs["input_ids"].shape[1] + max_new_tokens + WARMUP, device)
    if why:
        if strict:
            raise UserError(f"{asked}=on: {why}, or use {asked}=off")
        log.warning("%s=auto: %s; the eager step runs instead", asked, why)
        return None
    falls_back = Exception if asked == "compile" else RuntimeError  # torch.cuda's errors; a compiler's, any kind
    try:
        return GraphedStep(patcher, inputs, max_new_tokens, capture)
    except falls_back as err:
        if strict:
            raise
        log.warning("%s=auto: %s the patched step failed (%s); the eager step runs instead", asked,
                    "recording" if asked == "graphs" else "compiling",
                    (str(err).splitlines() or [type(err).__name__])[0])
        patcher._deferred.clear()  # what the failed recording left is no token's
        return None
