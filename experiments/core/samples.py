"""samples.jsonl: the tokens a text-generating run produced, one JSON line per prompt and token position
(lm-evaluation-harness's `--log_samples` habit), so that a reader sees the texts, not only their metrics.

Each line: `prompt`, `step` (the generated token's index), `position` (its index in the sequence), and per
model (`context`: with the context, `patched`: the patched weights without it, `control`: the unpatched
model without it, where the run has one) its top-1 token, `{"id": ..., "text": ...}`; `generated`, the
token the run fed on (the with-context model's choice, sampled or greedy); whether the patched and the
control top-1 agree with the context's (`top1_agree`, `control_top1_agree`), and their logit distances to
the with-context logits (`logit_linf`, `logit_linf_rel`: max |Δlogit| and over max |logit|, `tvd`: the
total variation of the softmaxes), in float64. `RunContext.sample` keeps them and writes the file with the
metrics; `icl-exp show RUN_DIR` prints them side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"


def _token(tokenizer, token_id: int) -> dict:
    text = tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)
    return {"id": int(token_id), "text": text}


def _distances(reference, other) -> dict[str, float]:
    import torch

    ref, oth = reference.detach().double().reshape(-1).cpu(), other.detach().double().reshape(-1).cpu()
    linf = float((ref - oth).abs().max())
    tvd = 0.5 * float((torch.softmax(ref, -1) - torch.softmax(oth, -1)).abs().sum())
    return {"logit_linf": linf, "logit_linf_rel": linf / max(float(ref.abs().max()), 1e-300), "tvd": tvd}


def token_sample(tokenizer, step: int, context_logits, patched_logits, control_logits=None,
                 generated: int | None = None, **index: Any) -> dict:
    """One line of samples.jsonl from the three next-token logit vectors (`control_logits` may be None) at
    `step`; `index` says where (prompt=, position=, variant=, dtype=, ...)."""
    context, patched, control = context_logits, patched_logits, control_logits
    top = {name: int(logits.reshape(-1).argmax()) for name, logits in
           (("context", context), ("patched", patched), ("control", control)) if logits is not None}
    record: dict[str, Any] = {**index, "step": int(step)}
    record["generated"] = _token(tokenizer, top["context"] if generated is None else int(generated))
    for name in ("context", "patched", "control"):
        record[name] = _token(tokenizer, top[name]) if name in top else None
    record["top1_agree"] = top["patched"] == top["context"]
    record.update(_distances(context, patched))
    if control is not None:
        record["control_top1_agree"] = top["control"] == top["context"]
        record.update({f"control_{k}": v for k, v in _distances(context, control).items()})
    return record


def write_samples(path: Path, samples: list[dict]) -> None:
    from experiments.core.atomic import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))


def samples_path(run_dir: Path) -> Path:
    """The run's samples.jsonl, or its gzipped copy (a committed run keeps a large one gzipped)."""
    plain = Path(run_dir) / SAMPLES_FILE
    zipped = plain.with_name(SAMPLES_FILE + ".gz")
    return zipped if zipped.is_file() and not plain.is_file() else plain


def read_samples(path: Path) -> list[dict]:
    path = Path(path)
    if path.suffix == ".gz":
        import gzip

        text = gzip.decompress(path.read_bytes()).decode()
    else:
        text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def reply_sample(context_text: str, patched_text: str, control_text: str | None, **index: Any) -> dict:
    """One line of samples.jsonl for a run that compares whole replies, each model generating its own (free
    generations: system_compile): `level: reply`, the three texts, and whether the patched (and the control)
    reply is the with-context one (`top1_agree`, `control_top1_agree`: every greedy token the same)."""
    record: dict[str, Any] = {"level": "reply", **index, "context": {"text": context_text},
                              "patched": {"text": patched_text},
                              "control": None if control_text is None else {"text": control_text},
                              "top1_agree": patched_text == context_text}
    if control_text is not None:
        record["control_top1_agree"] = control_text == context_text
    return record
