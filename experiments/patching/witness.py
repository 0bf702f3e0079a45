"""The witness: the model run a second time, where the patching pipeline cannot reach it.

Every open-loop evidence claim judges logits that the pipeline did not produce. The witness is a second
instance of the model: fresh module objects (a deep copy whose parameters and buffers are the model's own
tensors, shared and never written, so it costs activations only), no KV cache, no hook but its own. It runs
two forwards the claims are judged by:
- `patched`: the query token alone, with the token's patched tensors in place of its parameters
  (`functional_call`, the same tensors the instrumented pass ran with), each layer's output read by the
  witness's own read-only hooks, placed before the call and removed after it;
- `reference`: the with-context side, one uncached forward of the whole sequence (the prompt and the reply
  so far), its logits and each layer's output at every query position of the reply.

A replay (a hook that feeds a layer the recorded input), logits read from the wrong tensor, or a context
leaking into the patched pass through the cache change what the instrumented pass reports, never what the
witness computes: its modules were never handed to the pipeline. So that nothing else can reach it either,
each witness forward first audits both models and torch's global module hooks and refuses (`HookFound`,
one line naming the hook) on any forward hook or forward pre-hook it did not place, or a forward replaced
on an instance (but for the float64 steps `zoo.float64.exact_float64_` installs: the deep copy rebinds them to
the witness's own modules).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.modules import module as torch_module

from experiments.core.errors import UserError
from experiments.patching.capture import first_output
from experiments.zoo.float64 import float64_forward
from experiments.zoo.loading import available_bytes

# the per-token inputs of a prompt, and what a generated text token adds to each (an image's pixels go whole)
PER_TOKEN = {"attention_mask": 1, "token_type_ids": 0, "mm_token_type_ids": 0}
_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


class HookFound(RuntimeError):
    """A hook the witness did not place: evidence would not be judged by an untouched forward."""


def _hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def foreign_hooks(model: nn.Module) -> list[str]:
    """Every forward hook, forward pre-hook and instance-level forward on `model`'s modules, and torch's global
    module hooks, as "where: what" lines (empty: none)."""
    found = [f"torch global {kind.removeprefix('_global_')}: {_hook_name(h)}"
             for kind in _GLOBAL_HOOKS for h in getattr(torch_module, kind).values()]
    for name, module in model.named_modules():
        where = name or type(model).__name__
        for kind in _MODULE_HOOKS:
            found += [f"{where} {kind.strip('_')[:-1]}: {_hook_name(h)}" for h in getattr(module, kind).values()]
        if "forward" in vars(module) and not float64_forward(module):
            found.append(f"{where}: forward replaced on the instance ({_hook_name(vars(module)['forward'])})")
    return found


def refuse_hooks(model: nn.Module, whose: str) -> None:
    found = foreign_hooks(model)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise HookFound(f"the {whose} has a hook the witness did not place: {found[0]}{more}; remove it "
                        "(handle.remove()) before patching: evidence must come from an untouched forward")


@dataclass
class WitnessPass:
    """The witness's forward of the query alone with the patched tensors."""

    logits: Tensor  # (vocab,) in the logit dtype
    hidden: list[Tensor]  # per layer: its output at the query, (d,)


@dataclass
class Reference:
    """The with-context side by the witness: one uncached forward of the whole sequence."""

    logits: Tensor  # (steps, vocab) in the logit dtype: row s is the with-context next-token logits at step s
    hidden: list[Tensor]  # per layer: (steps, d), its output at each step's query position


def reference_bytes(config, length: int, steps: int, width: int) -> int:
    """The activations of the witness's reference forward: `length` tokens through every layer (residual, MLP
    and one layer's attention scores at a time) in elements of `width` bytes, the kept per-layer outputs and
    `steps` rows of logits (float64 at most). From the model's config alone, so it can be asked before the
    model is loaded."""
    cfg = getattr(config, "text_config", None) or config
    d = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0)
    inner = getattr(cfg, "intermediate_size", None) or 4 * d
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 1)
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 1)
    return (length * (4 * d + 3 * inner + heads * length) * width + layers * steps * d * 8
            + steps * cfg.vocab_size * 8)


def too_large(length: int, need: int, free: int, device: torch.device | str) -> str:
    return (f"the witness's reference forward of {length} tokens needs about {need / 2**30:.1f} GiB of "
            f"activations beside the model; {free / 2**30:.1f} GiB are free on {torch.device(device).type}: "
            f"shorten the prompts or max_new_tokens")


class Witness:
    """A hook-free second instance of `model` sharing its parameters (see the module's docstring). `layers`
    finds a model's decoder layers (the adapter's `layers`), `logit_dtype` is what logits are compared in."""

    def __init__(self, model: nn.Module, layers: Callable[[nn.Module], nn.ModuleList], logit_dtype: torch.dtype):
        refuse_hooks(model, "model")
        self.model = model
        self.logit_dtype = logit_dtype
        # fresh modules, the very same tensors: the deep copy finds every parameter and buffer in its memo
        shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
        self.twin = copy.deepcopy(model, memo=shared)
        self.layers = layers(self.twin)

    def audit(self) -> None:
        """Refuse if either model, or torch's global hooks, holds a hook the witness did not place."""
        refuse_hooks(self.twin, "witness")
        refuse_hooks(self.model, "model")

    def check_memory(self, length: int, steps: int, device: torch.device) -> None:
        """Refuse (UserError: one line), before the prompt is generated and naming the memory, a reference
        forward whose activations cannot fit (`reference_bytes`) in what is free beside the loaded model."""
        width = next(self.twin.parameters()).element_size()
        need = reference_bytes(self.twin.config, length, steps, width)
        free = available_bytes(device)
        if need > free:
            raise UserError(too_large(length, need, free, device))

    @contextmanager
    def _reading(self, where: Callable[[Tensor], Tensor]):
        """The witness's own read-only hooks: each layer's output, `where` picks the positions kept."""
        kept: list[Tensor | None] = [None] * len(self.layers)

        def keep(index: int):
            def hook(_m, _args, output):
                kept[index] = where(first_output(output)).detach()

            return hook

        self.audit()
        handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(self.layers)]
        try:
            yield kept
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def patched(self, query: Tensor, tensors: dict[str, Tensor], actions: dict | None = None) -> WitnessPass:
        """The query alone through the witness with `tensors` (full parameter names) in place of its parameters,
        and with apply=action the kept rank-1 actions on its own modules (its own hooks, removed after)."""
        from experiments.patching.patcher import register_actions

        with self._reading(lambda h: h[0, -1]) as hidden:
            handles = register_actions(self.twin, actions or {})
            try:
                out = functional_call(self.twin, tensors, (), {"input_ids": query.view(1, -1), "use_cache": False})
            finally:
                for h in handles:
                    h.remove()
        return WitnessPass(out.logits[0, -1].to(self.logit_dtype), list(hidden))

    @torch.no_grad()
    def reference(self, inputs: dict, tokens: list[int], steps: int) -> Reference:
        """The with-context logits and layer outputs at the reply's first `steps` query positions (the prompt's
        last token, then each of `tokens`), by one uncached forward of the prompt and `tokens`."""
        ids = inputs["input_ids"]
        n = ids.shape[1]
        full = dict(inputs, input_ids=torch.cat([ids, ids.new_tensor([tokens]).view(1, -1)], dim=1))
        for key, fill in PER_TOKEN.items():
            if inputs.get(key) is not None:
                pad = torch.full((1, len(tokens)), fill, dtype=inputs[key].dtype, device=ids.device)
                full[key] = torch.cat([inputs[key], pad], dim=1)
        positions = torch.arange(n - 1, n - 1 + steps, device=ids.device)
        with self._reading(lambda h: h[0, positions]) as hidden:
            out = self.twin(**full, use_cache=False, logits_to_keep=positions)
        return Reference(out.logits[0].to(self.logit_dtype), list(hidden))
