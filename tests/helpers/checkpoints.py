"""Tiny random models saved as a user's checkpoint folders (weights + the byte tokenizer), for tests that run
the CLI on a local folder the way a user's own checkpoint is run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from experiments.zoo.tokenizer import byte_tokenizer


def checkpoint_folders(root: Path, names: Iterable[str], build: Callable[[str, int], object]) -> dict[str, Path]:
    """root/<name> for each name: `build(name, vocab_size)`'s model saved beside the byte tokenizer."""
    tok = byte_tokenizer()
    out = {}
    for name in names:
        build(name, len(tok)).save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = root / name
    return out


def float64_open_loop(icl, folders: dict[str, Path], names: list[str], sweep: Path) -> dict[str, object]:
    """patch_match's naive open loop in float64 over these checkpoint folders (one sweep, 3 tokens each),
    through the CLI (`icl`: the session's runner); each folder's metrics.csv as a DataFrame."""
    import pandas as pd

    r = icl("run", "patch_match", "-m", "preset=smoke", "dtype=float64", "variant=naive", "max_new_tokens=3",
            "model=" + ",".join(str(folders[n]) for n in names), f"hydra.sweep.dir={sweep}")
    assert r.returncode == 0, r.stderr[-3000:]
    return {name: pd.read_csv(sweep / str(job) / "metrics.csv") for job, name in enumerate(names)}


def assert_patched_exactly(metrics, name: str, bound: float) -> None:
    """Every token matched, the patched logits within `bound` (float64 rounding) of the with-context ones,
    and the control, the token alone unpatched, far off."""
    value = lambda metric: metrics.loc[metrics["metric"] == metric, "value"]  # noqa: E731
    assert len(value("top1_match")) >= 3 and value("top1_match").all(), name  # 3 tokens of each prompt
    assert value("logit_linf_rel").max() < bound, (name, value("logit_linf_rel").max())
    assert value("control_logit_linf").median() > 0.1, name
