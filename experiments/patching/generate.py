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

`patched_generate` is the other direction: the patched model picks every token (and so the next
query); the with-context pass runs only as far as the per-layer targets, without its LM head.

Only one layer's patched tensors exist at a time (`PatchBuffers`), so memory stays that of plain
generation plus a few matrices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from experiments.patching.kinds import ADVANCE_CONTEXT, ADVANCE_MODES, ADVANCE_PATCHED
from experiments.patching.patcher import PatchedPass, Patcher
from experiments.patching.variants import CLOSED, VARIANTS, ClosedLoopLastLayer


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
    uncached: Tensor | None = None  # the with-context logits again, by a forward of the whole sequence, no cache

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
                       check_cache: bool = False, advance: str = ADVANCE_CONTEXT) -> Iterator[Step]:
    """§4.1: generate with the context; at every step patch for the whole prefix, compare, and go on
    with the baseline's token (also after a top-1 mismatch), or with `advance="patched"` with the patched
    model's token (both models then see the patched model's text so far). At the steps `stock_at` picks, the patched
    tensors are also run as stock weights (`Patcher.stock_logits`; a closed loop's check: an open loop's
    patched pass already is that forward). With `control`, the unpatched model without the context; and for
    a closed loop, the closed loop at the last layer alone. With `check_cache`, the last step of the reply
    also runs the whole sequence (prompt and reply so far) uncached (`Step.uncached`), so that a bug upstream
    of the targets (cache, positions, prompt) shows against the KV-cached logits."""
    if advance not in ADVANCE_MODES:
        raise ValueError(f"advance={advance!r} is not one of {', '.join(ADVANCE_MODES)}")
    ids = inputs["input_ids"]
    cache, query = patcher.start(inputs)
    tokens: list[int] = []
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
        ctrl = patcher.control_pass(query, ctx.record) if control else None
        control_ms = _ms(t0) if control else 0.0
        stock = patcher.stock_logits(query, keep) if keep is not None else None
        last = patcher.patched_pass(query, ctx, variant=last_layer) if last_layer is not None else None
        token, patched_token = choose(ctx.logits, patched.logits)
        taken = patched_token if advance == ADVANCE_PATCHED else token
        final = step == max_new_tokens - 1 or bool(stop_ids and taken in stop_ids)
        uncached = uncached_logits(patcher, inputs, tokens) if check_cache and final else None
        yield Step(step, token, patched_token, ctx.logits, patched, ctrl, baseline_ms, patch_ms, control_ms, stock,
                   last, uncached)
        if stop_ids and taken in stop_ids:
            break
        tokens.append(taken)
        query = torch.tensor([[taken]], device=ids.device)


# inputs that run along the sequence, and what a generated (text) token adds to each
_PER_TOKEN = {"attention_mask": 1, "token_type_ids": 0, "mm_token_type_ids": 0}


@torch.no_grad()
def uncached_logits(patcher: Patcher, inputs: dict, tokens: list[int]) -> Tensor:
    """The with-context logits at the newest query by one forward of the whole sequence, the prompt and the
    `tokens` generated so far, without a KV cache: what the cached step must give."""
    ids = inputs["input_ids"]
    extra = torch.tensor([tokens], dtype=ids.dtype, device=ids.device).view(1, -1)
    full = dict(inputs, input_ids=torch.cat([ids, extra], dim=1))
    for key, fill in _PER_TOKEN.items():
        if key in inputs and inputs[key] is not None:
            pad = torch.full((1, len(tokens)), fill, dtype=inputs[key].dtype, device=ids.device)
            full[key] = torch.cat([inputs[key], pad], dim=1)
    out = patcher.model(**full, use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].to(patcher.logit_dtype)


@dataclass
class GeneratedToken:
    """One token of patched generation, chosen by the patched model."""

    step: int
    token_id: int
    context_ms: float  # the with-context decoder body, KV-cached: the targets only
    patch_ms: float  # the patches and the patched forward

    @property
    def ms(self) -> float:
        return self.context_ms + self.patch_ms


def patched_generate(patcher: Patcher, inputs: dict, max_new_tokens: int,
                     choose: Callable[[Tensor], int] = lambda logits: int(logits.argmax()),
                     stop_ids: set[int] | None = None) -> Iterator[GeneratedToken]:
    """Generation by the patched model alone: each token is the patched model's choice, and the query of
    the next step. The with-context pass runs only to give the per-layer targets and to extend its cache
    with that token, so it stops before the LM head (its logits are not needed). Greedy, this emits the
    tokens of the model's own greedy generation with the context wherever the patch is exact."""
    ids = inputs["input_ids"]
    cache, query = patcher.start(inputs)
    for step in range(max_new_tokens):
        t0 = _now()
        ctx = patcher.context_step({"input_ids": query}, cache, logits=False)
        cache = ctx.cache
        context_ms = _ms(t0)
        t0 = _now()
        token = choose(patcher.patched_pass(query, ctx).logits)
        patch_ms = _ms(t0)
        yield GeneratedToken(step, token, context_ms, patch_ms)
        if stop_ids and token in stop_ids:
            break
        query = torch.tensor([[token]], device=ids.device)
