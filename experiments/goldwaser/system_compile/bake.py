"""The trained way: prompt baking. A LoRA (peft) on the model WITHOUT the system prompt, trained so that its
next-token distributions along the fit continuations match the prompted model's:

    loss = mean over fit positions of KL(p_prompted ‖ q_unprompted+LoRA)

(Bhargava et al.'s Prompt Baking, and prompt/context distillation, minimize this forward KL). The teacher's
distributions are computed once, before training; the student reads each fit sequence without the system
prompt. AdamW on the LoRA factors (gradient norm clipped, learning rate decaying linearly to 0), `batch` sequences a
step (gradients accumulated one sequence at a time, so memory stays that of one sequence), drawn in a seeded
order. Every step's training KL goes to
metrics.csv (`bake_kl`), and every `eval_every` steps the KL on queries it is not trained on (`bake_eval_kl`, its
`split` the validation queries when the run has some, else the held-out ones): the curve.

After training the LoRA is merged into the weights (peft's merge_and_unload): what is measured and saved is
a stock model whose target matrices changed, and `Merged.restore` puts the originals back."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.core.progress import progress

GRAD_CLIP = 1.0  # the LoRA factors' gradient norm, clipped: one odd continuation must not throw the run off


@dataclass(frozen=True)
class BakeExample:
    """One fit sequence: the ids without the system prompt, the continuation, and the teacher's log-probs
    (len(reply), V) along it, float32."""

    plain: tuple[int, ...]
    reply: tuple[int, ...]
    teacher_logp: Tensor


@dataclass(frozen=True)
class BakeSettings:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    steps: int
    lr: float
    batch: int
    eval_every: int
    seed: int


@dataclass
class Merged:
    """The LoRA merged into the model: the original matrices to put back, and the budget."""

    originals: dict[str, Tensor] = field(default_factory=dict)
    lora_params: int = 0
    rank: int = 0

    @torch.no_grad()
    def restore(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        for name, original in self.originals.items():
            params[name].copy_(original)

    def budget(self, model: nn.Module) -> dict[str, float]:
        params = dict(model.named_parameters())
        changed = sum(int((params[n].detach() != o).sum()) for n, o in self.originals.items())
        return dict(rank=self.rank, params_factored=self.lora_params, params_changed=changed)


def kl_loss(logits: Tensor, teacher_logp: Tensor) -> Tensor:
    """Mean over rows of KL(teacher ‖ softmax(logits))."""
    logq = torch.log_softmax(logits.float(), -1)
    return (teacher_logp.exp() * (teacher_logp - logq)).sum(-1).mean()


def _student_logits(model: nn.Module, ex: BakeExample) -> Tensor:
    device = next(model.parameters()).device
    ids = torch.tensor([[*ex.plain, *ex.reply[:-1]]], device=device)
    return model(input_ids=ids, use_cache=False, logits_to_keep=len(ex.reply)).logits[0]


def bake(model: nn.Module, data: list[BakeExample], s: BakeSettings, log: Callable[..., None],
         eval_kl: Callable[[nn.Module], float] | None = None, eval_split: str = "heldout") -> Merged:
    """Train a LoRA on `data` (module docstring), merge it into `model`'s weights, and return what to
    restore. `log(metric, value, step=)` takes the curve; `eval_kl(model)` measures the KL on the `eval_split`
    queries."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(s.seed)  # the LoRA's A factors (B starts at 0: step 0 is the unpatched model)
    config = LoraConfig(r=s.rank, lora_alpha=s.alpha, target_modules=list(s.targets), lora_dropout=0.0,
                        bias="none")
    with warnings.catch_warnings():  # transformers' FutureWarning about a name peft reads (is_gradient_checkpointing)
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = get_peft_model(model, config)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=s.lr, weight_decay=0.0)
    # the learning rate decays linearly to 0 over the steps: a short run ends on its smallest steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1.0 - done / s.steps)
    order = torch.Generator().manual_seed(s.seed)
    queue: list[int] = []
    try:
        if eval_kl is not None and s.eval_every:
            with torch.no_grad():
                log("bake_eval_kl", eval_kl(wrapped), step=0, split=eval_split)
        with progress(s.steps, "bake") as bar:
            for step in range(1, s.steps + 1):
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for _ in range(min(s.batch, len(data))):
                    if not queue:  # a new pass over the fit sequences, in a seeded order
                        queue = torch.randperm(len(data), generator=order).tolist()
                    ex = data[queue.pop()]
                    loss = kl_loss(_student_logits(wrapped, ex), ex.teacher_logp) / min(s.batch, len(data))
                    loss.backward()
                    total += loss.item()
                torch.nn.utils.clip_grad_norm_(trainable, GRAD_CLIP)
                optimizer.step()
                schedule.step()
                log("bake_kl", total, step=step)
                # eval_every=0: at the end only
                if eval_kl is not None and ((s.eval_every and step % s.eval_every == 0) or step == s.steps):
                    with torch.no_grad():
                        log("bake_eval_kl", eval_kl(wrapped), step=step, split=eval_split)
                bar.advance(1, info=f"KL {total:.3g}")
    except BaseException:
        wrapped.unload()  # the LoRA layers out again, the base weights untouched
        raise
    return _merge(wrapped, s.rank, sum(p.numel() for p in trainable))


@torch.no_grad()
def _merge(wrapped, rank: int, lora_params: int) -> Merged:
    """merge_and_unload, keeping the originals of the matrices it changes."""
    merged = Merged(lora_params=lora_params, rank=rank)
    base = wrapped.get_base_model()
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "get_base_layer"):
            merged.originals[f"{name}.weight"] = module.get_base_layer().weight.detach().clone()
    model = wrapped.merge_and_unload()
    if hasattr(model, "peft_config"):  # a stock model again: save_pretrained must not see an adapter
        del model.peft_config
    model.requires_grad_(False)
    return merged
