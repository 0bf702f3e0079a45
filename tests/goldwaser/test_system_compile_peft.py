"""`icl-exp patch compile ... format=peft`: the compiled change as a PEFT LoRA adapter that stock peft loads
onto the base model and that gives the merged checkpoint's logits (tiny-llama, float32); the refusals when
the change is not low rank or nothing is saved."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.helpers.cli import run_cli

SYSTEM = ("system=Begin every answer with the word 'Ahoy'.", "check=starts_with:Ahoy")
TINY = ("model=tiny-llama", "queries=[Hi?,Why?,How so?,What now?]", "heldout=2", "max_new_tokens=5",
        "rank=2", "steps=3", "batch=2")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("method, extra", [("bake", ()), ("analytic", ("analytic_rank=2",))])
def test_a_peft_adapter_reloads_onto_the_base_and_gives_the_merged_checkpoints_logits(tmp_path, method, extra):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from experiments.zoo.loading import load_model

    merged_dir, peft_dir = tmp_path / "merged", tmp_path / "peft"
    for out, fmt in ((merged_dir, "merged"), (peft_dir, "peft")):
        res = run_cli("patch", "compile", f"method={method}", *SYSTEM, *TINY, *extra, f"format={fmt}", f"out={out}")
        assert res.returncode == 0, res.stderr[-3000:]
    assert (peft_dir / "adapter_config.json").is_file() and (peft_dir / "adapter_model.safetensors").is_file()
    assert not (peft_dir / "model.safetensors").exists()
    assert (peft_dir / "adapter_model.safetensors").stat().st_size < (merged_dir / "model.safetensors").stat().st_size
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["peft_type"] == "LORA"
    claims = pd.read_csv(peft_dir / "claims.csv").set_index("id")
    assert bool(claims.loc["system_compile.checkpoint.reproduced", "passed"])

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    adapted = PeftModel.from_pretrained(load_model("tiny-llama", torch.float32).model, str(peft_dir)).eval()
    base = load_model("tiny-llama", torch.float32).model
    for q in json.loads((peft_dir / "compiled.json").read_text())["queries"]:
        ids = torch.tensor([[*q["plain_ids"], *q["reply_ids"]]])
        with torch.no_grad():
            want, got, plain = merged(ids).logits, adapted(ids).logits, base(ids).logits
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        assert (plain - want).abs().max() > 100 * (got - want).abs().max()  # the adapter is what changed them


def test_peft_for_an_analytic_patch_that_is_not_low_rank_says_what_rank_it_would_take(tmp_path):
    res = run_cli("patch", "compile", "method=analytic", *SYSTEM, *TINY, "format=peft", f"out={tmp_path / 'x'}")
    assert res.returncode == 2 and "format=peft: the analytic patch is not low rank (up to rank" in res.stderr
    assert "give analytic_rank=R" in res.stderr and not (tmp_path / "x").exists()


def test_peft_without_a_saved_method_is_refused(tmp_path):
    from tests.helpers.in_process import refusal

    assert "give save=analytic|bake with it" in refusal("system_compile", tmp_path / "run", "format=peft")
