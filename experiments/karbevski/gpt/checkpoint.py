"""Training checkpoints in the run folder: `checkpoint.pt` (weights, optimizer, step, the curve so far)
and `checkpoint.json` (what it is: variant, model shape, tokenizer, data, step, file size), both written
atomically so Ctrl-C or a kill mid-save leaves the previous checkpoint intact.

`describe()` is checked against the run's configuration before a resume starts: a checkpoint of another
variant, shape or vocabulary is refused in one line, before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from experiments.core.atomic import write_atomic, write_json_atomic
from experiments.core.errors import UserError
from experiments.karbevski.gpt.model import GPTConfig

CKPT = "checkpoint.pt"
CKPT_META = "checkpoint.json"
# what must agree for a resume to continue the same run
IDENTITY_KEYS = ("variant", "model", "tokenizer", "data")


def describe(variant: str, model_cfg: GPTConfig, tokenizer: str, data: str) -> dict:
    return {"variant": variant, "model": asdict(model_cfg), "tokenizer": tokenizer, "data": data}


def save(run_dir: Path, identity: dict, step: int, model: torch.nn.Module, optimizer, curve: list[dict]) -> Path:
    path = Path(run_dir) / CKPT
    state = {"identity": identity, "step": step, "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "curve": curve}
    write_atomic(path, lambda p: torch.save(state, p))
    write_json_atomic(Path(run_dir) / CKPT_META, {**identity, "step": step, "bytes": path.stat().st_size})
    return path


def locate(resume: str) -> Path:
    """A run folder or a checkpoint.pt -> the checkpoint.pt."""
    p = Path(resume).expanduser()
    path = p / CKPT if p.is_dir() else p
    if not path.is_file():
        raise UserError(f"resume={resume}: no {CKPT} there (a run folder of gpt_wq or its {CKPT})")
    return path


def check_compatible(resume: str, identity: dict) -> dict:
    """Cheap check before a run folder is made: the json beside the checkpoint, and the file's size."""
    path = locate(resume)
    meta_path = path.parent / CKPT_META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        raise UserError(f"resume={resume}: {meta_path.name} is missing or unreadable; the checkpoint cannot be "
                        f"checked") from None
    for key in IDENTITY_KEYS:
        if meta.get(key) != identity[key]:
            raise UserError(f"resume={resume}: the checkpoint is of another {key} ({_short(meta.get(key))} vs "
                            f"{_short(identity[key])} asked for)")
    if meta.get("bytes") != path.stat().st_size:
        raise UserError(f"resume={resume}: {path.name} is {path.stat().st_size} bytes, {meta.get('bytes')} were "
                        f"written: truncated or replaced")
    return meta


def load(resume: str, identity: dict, map_location) -> dict:
    path = locate(resume)
    check_compatible(resume, identity)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated zip, unpickling error, ...
        raise UserError(f"resume={resume}: {path.name} is corrupt ({type(err).__name__})") from None
    if state.get("identity") != identity:
        raise UserError(f"resume={resume}: {path.name} does not match its {CKPT_META}")
    return state


def _short(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if k in ("d_model", "n_layer", "vocab_size", "query"))
    return str(value)
