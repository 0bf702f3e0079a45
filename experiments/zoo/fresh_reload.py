"""A saved checkpoint's next-token logits for one query token, computed in a fresh Python process.

An exported checkpoint counts only if stock transformers, with nothing of this process in memory (no
patcher, no cached module, no hook), reproduces what the export says it holds. `fresh_logits(folder, ...)`
runs this module as `python -m experiments.zoo.fresh_reload FOLDER QUERY_ID DTYPE DEVICE OUT [KWARGS_JSON]`:
it loads FOLDER with `zoo.float64.reload_float64` (stock `from_pretrained`, with the keywords the caller's
catalog asks for the config, zoo/catalog.py; float64 end to end for float64), feeds the query token alone and
saves the logits (float64 for a float64 model, float32 otherwise) to OUT.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def fresh_logits(folder: Path, query_id: int, dtype: torch.dtype, device: torch.device,
                 load_kwargs: dict | None = None) -> torch.Tensor:
    """The checkpoint in `folder` fed `query_id` alone, in a fresh process, loaded with `load_kwargs` (what the
    caller's catalog asks: an MoE's eager experts); the logits on `device`. A reload that fails raises
    RuntimeError with the child's last line."""
    name = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.pt"
        res = subprocess.run([sys.executable, "-m", __name__, str(folder), str(query_id), name, str(device), str(out),
                              json.dumps(load_kwargs or {})],
                             capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"the fresh-process reload of {folder} failed: {last}")
        return torch.load(out, weights_only=True).to(device)


def _main(folder: str, query_id: str, dtype: str, device: str, out: str, load_kwargs: str = "{}") -> None:
    from experiments.zoo.float64 import reload_float64
    from experiments.zoo.quiet import quiet_transformers

    with quiet_transformers():
        model = reload_float64(folder, getattr(torch, dtype), **json.loads(load_kwargs)).to(device)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[int(query_id)]], device=device)).logits[0, -1]
    # compared in float64 for a float64 model, in float32 otherwise (patching/compare.logit_dtype)
    torch.save(logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32).cpu(), out)


if __name__ == "__main__":
    _main(*sys.argv[1:])
