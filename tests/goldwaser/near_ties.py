"""bfloat16 top-1 agreement that holds on any CPU: a miss is accepted only at a near tie.

bfloat16 kernels round differently per instruction set (AVX-512, AVX2, the default kernels), so the
patched model and the model with the context can swap two top tokens whose logits differ by about one
bfloat16 rounding. Such a miss is acceptable; any other is not. Whether a step was a near tie is read
from the with-context logits themselves, recomputed here by a plain forward pass (no KV cache, no
patching code) on the prompt and the tokens the run generated before that step.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

BF16_ULPS = 2  # the top-2 gap may flip when each of the two logits is off by one bfloat16 ulp


def bf16_ulp(x: float) -> float:
    """The spacing of bfloat16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (torch.tensor(abs(x)).log2().floor().item() - 7)


def near_tie_misses(run_dir: Path) -> list[dict]:
    """Every top-1 miss of a patch_match / gemma_match run, with the with-context top-2 gap and the
    bound it is judged against (BF16_ULPS ulps of bfloat16 at max |logit|)."""
    from experiments.goldwaser.common import prompt_list
    from experiments.patching.load import load_checked
    from experiments.zoo.prompts import encode_prompt

    cfg = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml")
    m = pd.read_csv(Path(run_dir) / "metrics.csv")
    top1 = m[m["metric"] == "top1_match"].sort_values(["prompt", "step"])
    if (top1["value"] == 1.0).all():
        return []
    bundle = load_checked(cfg.model, torch.bfloat16, "cpu", seed=int(cfg.seed))
    out = []
    for p, text in enumerate(prompt_list(cfg)):
        ids = encode_prompt(bundle, text, None, bool(cfg.chat_template), "cpu")["input_ids"]
        for row in top1[top1["prompt"] == p].itertuples():
            if row.value != 1.0:
                with torch.no_grad():
                    logits = bundle.model(ids).logits[0, -1].float()
                top2 = logits.topk(2).values
                scale = float(logits.abs().max())
                out.append(dict(prompt=p, step=int(row.step), gap=float(top2[0] - top2[1]),
                                bound=BF16_ULPS * bf16_ulp(scale), max_logit=scale))
            ids = torch.cat([ids, torch.tensor([[int(row.token_id)]])], dim=1)
    return out


def assert_misses_are_near_ties(run_dir: Path) -> None:
    bad = [miss for miss in near_tie_misses(run_dir) if miss["gap"] > miss["bound"]]
    assert not bad, f"top-1 misses that are not bfloat16 near ties: {bad}"
