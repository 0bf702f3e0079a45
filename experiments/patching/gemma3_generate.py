"""Algorithm 1 on a whole Gemma 3 model, once per generated token, and the comparison of §4.1.

For every step of generation the with-context pass runs as in plain KV-cached generation (the cache
of the earlier steps is reused) and leaves each layer's activations at the query position (hooks).
Algorithm 1 then patches layer after layer: layer l's patch is computed for its target input x_{l−1}
(the with-context pass's output of layer l−1) and the empty reduced context, and the patched model —
the query token alone, embedded, through every decoder layer's own forward with its patched weights,
the final norm and the output layer — runs as one genuine forward. Nothing recorded is fed forward:
the recorded activations only define the patches, and the per-layer distance between the patched
pass's hidden states and the targets is reported (`hidden_linf`).

Only one layer's patched tensors exist at a time (`PatchBuffers`), so memory stays that of plain
generation plus a few matrices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.patching.gemma3 import (
    LayerPatchStats,
    PatchBuffers,
    attention_residual,
    capture_query_activations,
    patch_layer,
    patched_layer_forward,
)


def logit_comparison(reference: Tensor, other: Tensor) -> dict[str, float]:
    """L∞ of the logit difference (absolute, and relative to max |reference|), the total variation
    distance ½‖p − q‖₁ of the two softmax distributions, and whether the top-1 tokens agree."""
    a, b = reference.double(), other.double()
    linf = float((a - b).abs().max())
    return {
        "logit_linf": linf,
        "logit_linf_rel": linf / max(float(a.abs().max()), 1e-300),
        "tvd": 0.5 * float((a.softmax(-1) - b.softmax(-1)).abs().sum()),
        "top1_match": float(int(a.argmax()) == int(b.argmax())),
    }


@dataclass
class PatchedPass:
    logits: Tensor  # (vocab,) float32
    hidden_linf: list[float]  # per layer: max |x′_l − x_l| between the patched pass and the target
    hidden_rel: list[float]  # the same, over max |x_l|
    layer_stats: list[LayerPatchStats] = field(default_factory=list)

    @property
    def div_zero(self) -> int:
        return sum(s.div_zero for s in self.layer_stats)

    @property
    def no_root(self) -> int:
        return sum(s.no_root for s in self.layer_stats)

    @property
    def dm_linf(self) -> float:
        return max(s.dm_linf for s in self.layer_stats)


class GemmaPatcher:
    """Per-token patches for a Gemma3ForCausalLM or Gemma3ForConditionalGeneration."""

    def __init__(self, model: nn.Module, variant: str = "naive"):
        self.model = model
        self.variant = variant
        inner = model.model
        self.lm = getattr(inner, "language_model", inner)  # the Gemma3TextModel
        self.text_config = self.lm.config
        self.bufs = PatchBuffers(dtype=self.lm.embed_tokens.weight.dtype)

    @property
    def layers(self) -> nn.ModuleList:
        return self.lm.layers

    def output_logits(self, hidden: Tensor) -> Tensor:
        """Final norm, output layer and (if configured) tanh soft-capping, as Gemma3ForCausalLM does."""
        logits = self.model.lm_head(self.lm.norm(hidden))
        cap = self.text_config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def context_step(self, inputs: dict, cache) -> tuple[Tensor, list, object]:
        """The with-context forward of the newest token(s) on top of `cache`: (logits, captures, cache)."""
        with capture_query_activations(self.layers) as caps:
            out = self.model(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float(), caps, out.past_key_values

    @torch.no_grad()
    def prefill(self, inputs: dict):
        out = self.model(**inputs, use_cache=True, logits_to_keep=1)
        return out.past_key_values

    @torch.no_grad()
    def patched_pass(self, query: Tensor, caps: list, keep: dict[str, Tensor] | None = None) -> PatchedPass:
        """Algorithm 1 for the query token, interleaved with the patched model's forward of it alone.

        With `keep`, every layer's patched tensors are also copied into it under their parameter names
        relative to the decoder (`layers.3.mlp.gate_proj.weight`, ...), e.g. to export a checkpoint."""
        hidden = self.lm.embed_tokens(query.view(1, 1))
        position = torch.zeros(1, 1, dtype=torch.long, device=hidden.device)
        rope = {t: self.lm.rotary_emb(hidden, position, t) for t in set(self.text_config.layer_types)}
        result = PatchedPass(logits=None, hidden_linf=[], hidden_rel=[])
        for index, (layer, cap, kind) in enumerate(zip(self.layers, caps, self.text_config.layer_types,
                                                       strict=True)):
            v = attention_residual(layer, cap.x_in.view(1, 1, -1), rope[kind])  # A(∅, x_{l−1})
            result.layer_stats.append(patch_layer(layer, cap, v, self.variant, self.bufs))
            if keep is not None:
                keep.update({f"layers.{index}.{k}": t.clone() for k, t in self.bufs.tensors.items()})
            hidden = patched_layer_forward(layer, self.bufs, hidden, rope[kind])
            target = cap.x_out.double()
            err = float((hidden.view(-1).double() - target).abs().max())
            result.hidden_linf.append(err)
            result.hidden_rel.append(err / max(float(target.abs().max()), 1e-300))
        result.logits = self.output_logits(hidden)[0, -1].float()
        return result

    @torch.no_grad()
    def control_logits(self, query: Tensor) -> Tensor:
        """The control: the unpatched model's own forward of the query token alone (no context)."""
        return self.model(input_ids=query.view(1, 1), use_cache=False).logits[0, -1].float()


@dataclass
class Step:
    """One generated token: what the model with the context and the patched model without it say."""

    step: int
    token_id: int  # the token generated (the baseline's choice, §4.1)
    patched_token_id: int  # what the patched model would have chosen
    context: Tensor  # with-context logits
    patched: PatchedPass
    control: Tensor | None  # unpatched, no-context logits
    baseline_ms: float  # the with-context, KV-cached step: plain generation's cost
    patch_ms: float  # Algorithm 1 + the patched forward
    control_ms: float = 0.0

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


def _ms(t0: float) -> float:
    return 1000.0 * (time.perf_counter() - t0)


def compare_generation(patcher: GemmaPatcher, inputs: dict, max_new_tokens: int,
                       choose: Callable[[Tensor, Tensor], tuple[int, int]] = greedy,
                       stop_ids: set[int] | None = None, control: bool = True) -> Iterator[Step]:
    """§4.1: generate with the context; at every step patch for the whole prefix, compare, and go on
    with the baseline's token (also after a top-1 mismatch)."""
    ids = inputs["input_ids"]
    prefix = {k: (v[:, :-1] if k in ("input_ids", "attention_mask", "token_type_ids") else v)
              for k, v in inputs.items()}
    cache = patcher.prefill(prefix) if ids.shape[1] > 1 else None
    query = ids[:, -1:]
    for step in range(max_new_tokens):
        t0 = time.perf_counter()
        context, caps, cache = patcher.context_step({"input_ids": query}, cache)
        baseline_ms = _ms(t0)
        t0 = time.perf_counter()
        patched = patcher.patched_pass(query, caps)
        patch_ms = _ms(t0)
        t0 = time.perf_counter()
        ctrl = patcher.control_logits(query) if control else None
        control_ms = _ms(t0) if control else 0.0
        token, patched_token = choose(context, patched.logits)
        yield Step(step, token, patched_token, context, patched, ctrl, baseline_ms, patch_ms, control_ms)
        if stop_ids and token in stop_ids:
            break
        query = torch.tensor([[token]], device=ids.device)
