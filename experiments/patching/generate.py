"""Generation with the context, and at every token the patched model without it (Goldwaser §4.1).

For every step the with-context pass runs as in plain KV-cached generation (the cache of the earlier
steps is reused) and leaves each layer's activations at the query position (hooks): the targets the
patches are computed from, and apart from them the record each layer's error is measured against. The
patched model, the query token alone through the model's own forward with every layer patched on the fly
(`patcher.Patcher`), then gives its next-token distribution; both are compared. Nothing recorded is
fed forward: the targets only define the patches, and the per-layer distance between the patched pass's
hidden states and the record is reported (`hidden_linf`, `hidden_rel`). Beside it the control, the
unpatched model on the query alone (its logits, and its per-layer distance to the record), and for a
closed loop its own control, the closed loop at the last layer alone (`closed_loop_last`).

With a witness (witness.py), an open loop's patched tensors also run through a hook-free twin of the model,
which must give the instrumented pass's logits and layer outputs bit for bit, and after each prompt the twin's
uncached forward of prompt and reply is the reference every evidence claim judges by (`reference_for`).

`patched_generate` is the other direction: the patched model picks every token (and so the next
query); the with-context pass runs only as far as the per-layer targets, without its LM head.

Only one layer's patched tensors exist at a time (`PatchBuffers`), so memory stays that of plain
generation plus a few matrices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from experiments.patching import taps
from experiments.patching.kinds import ADVANCE_CONTEXT, ADVANCE_MODES, ADVANCE_PATCHED
from experiments.patching.patcher import PatchedPass, Patcher
from experiments.patching.step_graph import Capture, recorded_step
from experiments.patching.variants import CLOSED, VARIANTS, ClosedLoopLastLayer
from experiments.patching.witness import Reference, Witness, WitnessPass


@dataclass
class Step:
    """One generated token: what the model with the context and the patched model without it say."""

    step: int
    token_id: int  # the with-context model's choice (§4.1; the text follows it unless advance="patched")
    patched_token_id: int  # what the patched model would have chosen
    context: Tensor  # with-context logits
    patched: PatchedPass
    control: PatchedPass | None  # the unpatched model, no context: logits and per-layer distance to the record
    baseline_ms: float  # the with-context, KV-cached step: plain generation's cost
    patch_ms: float  # Algorithm 1 + the patched forward
    control_ms: float = 0.0
    stock: Tensor | None = None  # the patched weights' stock forward (Patcher.stock_logits), where checked
    last_layer: PatchedPass | None = None  # a closed loop's control: the closed loop at the last layer alone
    query_id: int = -1  # the token this step's query is
    witness: WitnessPass | None = None  # an open loop's patched tensors run by the witness (witness.py)
    witness_diff: float = math.nan  # max |instrumented − witness| over the logits and every layer's output
    witness_ms: float = 0.0  # the witness's forward of the patched tensors (and its audit), not in patch_ms

    @property
    def patched_ms(self) -> float:
        """What a token costs in patched generation: the with-context pass (for the targets) + patch + forward."""
        return self.baseline_ms + self.patch_ms


def greedy(context: Tensor, patched: Tensor) -> tuple[int, int]:
    return int(context.argmax()), int(patched.argmax())


def coupled_sampler(generator: torch.Generator, temperature: float) -> Callable[[Tensor, Tensor], tuple[int, int]]:
    """Sample both distributions with the same random state, so equal distributions give equal tokens."""

    def sample(context: Tensor, patched: Tensor) -> tuple[int, int]:
        state = generator.get_state()
        tokens = []
        for logits in (context, patched):
            generator.set_state(state)
            p = (logits.double().cpu() / temperature).softmax(-1)
            tokens.append(int(torch.multinomial(p, 1, generator=generator)))
        return tokens[0], tokens[1]

    return sample


def _now() -> float:
    """The clock once the GPU has done what was queued: CUDA kernels run asynchronously, so without the
    synchronize a timer counts launches and the queued work lands in the next timer."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _ms(t0: float) -> float:
    return 1000.0 * (_now() - t0)


def compare_generation(patcher: Patcher, inputs: dict, max_new_tokens: int,
                       choose: Callable[[Tensor, Tensor], tuple[int, int]] = greedy,
                       stop_ids: set[int] | None = None, control: bool = True,
                       stock_at: Callable[[int], bool] = lambda step: False,
                       advance: str = ADVANCE_CONTEXT, witness: Witness | None = None) -> Iterator[Step]:
    """§4.1: generate with the context; at every step patch for the whole prefix, compare, and go on
    with the baseline's token (also after a top-1 mismatch), or with `advance="patched"` with the patched
    model's token (both models then see the patched model's text so far). At the steps `stock_at` picks, the patched
    tensors are also run as stock weights (`Patcher.stock_logits`; a closed loop's check: an open loop's
    patched pass already is that forward). With `control`, the unpatched model without the context; and for
    a closed loop, the closed loop at the last layer alone. With a `witness`, an open loop's patched tensors
    also run through it (`Step.witness`), and how far the instrumented pass is from it, logits and every
    layer, is `Step.witness_diff` (0 when they agree bit for bit); its reference for the prompt comes after
    the last step (`reference_for`)."""
    if advance not in ADVANCE_MODES:
        raise ValueError(f"advance={advance!r} is not one of {', '.join(ADVANCE_MODES)}")
    ids = inputs["input_ids"]
    if witness is not None:
        witness.audit()  # before the first hook of the pipeline's own: anything found is someone else's
        witness.check_memory(ids.shape[1] + max_new_tokens, max_new_tokens, ids.device)
    cache, query = patcher.start(inputs)
    last_layer = VARIANTS[ClosedLoopLastLayer.name] if control and patcher.variant.loop == CLOSED else None
    for step in range(max_new_tokens):
        t0 = _now()
        ctx = patcher.context_step({"input_ids": query}, cache)
        cache = ctx.cache
        baseline_ms = _ms(t0)
        t0 = _now()
        keep = {} if stock_at(step) else None
        patched = patcher.patched_pass(query, ctx, keep=keep)
        patch_ms = _ms(t0)
        t0 = _now()
        seen, diff = witnessed(witness, query, patched)
        witness_ms = _ms(t0)
        t0 = _now()
        ctrl = patcher.control_pass(query, ctx.record) if control else None
        control_ms = _ms(t0) if control else 0.0
        stock = patcher.stock_logits(query, keep) if keep is not None else None
        last = patcher.patched_pass(query, ctx, variant=last_layer) if last_layer is not None else None
        token, patched_token = choose(ctx.logits, patched.logits)
        taken = patched_token if advance == ADVANCE_PATCHED else token
        yield Step(step, token, patched_token, ctx.logits, patched, ctrl, baseline_ms, patch_ms, control_ms, stock,
                   last, int(query.reshape(-1)[-1]), seen, diff, witness_ms)
        if stop_ids and taken in stop_ids:
            break
        query = torch.tensor([[taken]], device=ids.device)


def witnessed(witness: Witness | None, query: Tensor, patched: PatchedPass) -> tuple[WitnessPass | None, float]:
    """An open loop's patched tensors through the witness, and the largest difference between the instrumented
    pass and it, over the logits and every layer's output (NaN anywhere: NaN). The patched tensors live in
    buffers the next token reuses, so the pass lets go of them here."""
    if witness is None or patched.tensors is None:
        return None, math.nan
    seen = witness.patched(query, patched.tensors, patched.actions)
    outputs, patched.outputs = patched.outputs, []
    patched.tensors = patched.actions = None
    if len(outputs) != len(seen.hidden):  # a pass that did not report every layer equals nothing
        return seen, math.inf
    pairs = [(patched.logits, seen.logits), *zip(outputs, seen.hidden, strict=True)]
    diffs = torch.stack([(a.double() - b.double()).abs().max() for a, b in pairs])
    return seen, float(diffs.max()) if not bool(diffs.isnan().any()) else math.nan


def reference_for(witness: Witness, inputs: dict, steps: list[Step]) -> Reference:
    """The witness's with-context reference for a prompt's `steps`: one uncached forward of the prompt and
    every query after the first (the tokens the text went on with)."""
    return witness.reference(inputs, [st.query_id for st in steps[1:]], len(steps))


class Span:
    """A timed stretch of a token's work. On CUDA two events recorded on the stream around it, read when `ms` is
    first asked (waiting then for that one event): nothing waits for the GPU between tokens, so the host queues
    the next token while the card runs this one. Elsewhere the clock, read as the stretch ends."""

    def __init__(self, device: torch.device):
        self._ms: float | None = None
        self.events = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> Span:
        if self.events is not None:
            self.events[1].record()
        else:
            self._ms = 1000.0 * (time.perf_counter() - self.t0)
        return self

    @property
    def ms(self) -> float:
        if self._ms is None:
            self.events[1].synchronize()
            self._ms = self.events[0].elapsed_time(self.events[1])
        return self._ms


@dataclass
class GeneratedToken:
    """One token of patched generation, chosen by the patched model."""

    step: int
    token: Tensor  # the token, 0-d on the model's device: reading it (`token_id`) is a read back to the host
    context: Span | None  # the with-context decoder body, KV-cached: the targets only (None: in `patch`, recorded)
    patch: Span  # the patches and the patched forward

    @property
    def token_id(self) -> int:
        return int(self.token)

    @property
    def context_ms(self) -> float:
        return 0.0 if self.context is None else self.context.ms

    @property
    def patch_ms(self) -> float:
        return self.patch.ms

    @property
    def ms(self) -> float:
        return self.context_ms + self.patch_ms


def patched_generate(patcher: Patcher, inputs: dict, max_new_tokens: int,
                     choose: Callable[[Tensor], Tensor | int] | None = None,
                     stop_ids: set[int] | None = None, graphs: str = "off",
                     capture: Capture | None = None, compile: str = "off") -> Iterator[GeneratedToken]:
    """Generation by the patched model alone: each token is the patched model's choice (greedy unless `choose`
    says otherwise), and the query of the next step. The with-context pass runs only to give the per-layer
    targets and to extend its cache with that token, so it stops before the LM head (its logits are not needed).
    Greedy, this emits the tokens of the model's own greedy generation with the context wherever the patch is
    exact.

    Once warmed, a token reads nothing back to the host (issue 54; a test counts it): the chosen token stays
    on the device as the next query, the patched pass's mask is given whole (`Patcher.query_mask`), and the
    passes' statistics and value checks wait on the device until the last token (`Patcher.read_deferred`,
    one read; a failed check raises there). Only `stop_ids` reads each token, to know whether to stop; the
    timers are CUDA events on a GPU (`Span`), read when a token's time is asked, so nothing waits between
    tokens. So the whole token (the with-context step on a static KV cache, the patched pass, the greedy choice)
    can be recorded once as a CUDA graph and replayed (`graphs`: auto, on, off; step_graph.py; `capture` for its
    tests), or compiled (`compile`: auto, on, off); its time is then all `patch_ms`."""
    if choose is not None and (graphs != "off" or compile != "off"):
        raise ValueError("graphs, compile: a recorded step chooses greedily; a `choose` of its own runs with "
                         "graphs=off compile=off")
    choose = choose or (lambda logits: logits.argmax())
    patcher.read_deferred()  # what an abandoned generation left queued is its own: read (and judged) now
    with taps.session(patcher.model):  # the hooks the first token places stay for the others (taps.py)
        yield from _generate(patcher, inputs, max_new_tokens, choose, stop_ids, graphs, capture, compile)
    patcher.read_deferred()


def _generate(patcher: Patcher, inputs: dict, max_new_tokens: int, choose: Callable, stop_ids: set[int] | None,
              graphs: str, capture: Capture | None, compile: str) -> Iterator[GeneratedToken]:
    ids = inputs["input_ids"]
    recorded = recorded_step(patcher, graphs, inputs, max_new_tokens, capture, compile)
    cache, query = (None, None) if recorded else patcher.start(inputs)
    for step in range(max_new_tokens):
        if recorded:
            span = Span(ids.device)
            token = recorded()
            yield GeneratedToken(step, token, None, span.stop())
        else:
            context = Span(ids.device)
            ctx = patcher.context_step({"input_ids": query}, cache, logits=False)
            cache = ctx.cache
            context.stop()
            span = Span(ids.device)
            token = choose(patcher.patched_pass(query, ctx, defer=True).logits)
            token = token if isinstance(token, Tensor) else torch.tensor(token, device=ids.device)
            yield GeneratedToken(step, token, context, span.stop())
            query = token.reshape(1, 1)
        if stop_ids and int(token) in stop_ids:
            break
