"""`icl-exp patch export`: a patched Hugging Face checkpoint that stock transformers loads and that,
fed the prompt's last token alone, gives the original model's next-token logits for the whole prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "cli.main", "patch", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("variant", ["naive", "stable"])
def test_export_round_trip_through_stock_transformers(tmp_path, variant):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    res = _cli("export", "model=tiny-gemma3", "prompt=Write a haiku about snow.", f"variant={variant}", f"out={out}")
    assert res.returncode == 0, res.stderr[-2000:]
    inputs = json.loads((out / "inputs.json").read_text())
    assert (out / "patched" / "model.safetensors").is_file() and (out / "patched" / "config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(out / "base").eval()
    patched = AutoModelForCausalLM.from_pretrained(out / "patched").eval()
    ids = torch.tensor([[*inputs["context_ids"], inputs["query_id"]]])
    query = torch.tensor([[inputs["query_id"]]])
    with torch.no_grad():
        want = base(ids).logits[0, -1]
        got = patched(query).logits[0, -1]
        control = base(query).logits[0, -1]
    assert int(got.argmax()) == int(want.argmax()) == inputs["reference_top1"]
    assert (got - want).abs().max() < 1e-2 * want.abs().max()
    assert (control - want).abs().max() > 0.1  # without the patch the token alone does not do it
    changed = [k for k, v in patched.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    kinds = {k.split(".", 3)[-1] for k in changed}
    expected = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "post_feedforward_layernorm.weight"}
    assert kinds == (expected | {"mlp.down_proj.weight"} if variant == "stable" else expected)


def test_export_errors_are_one_line(tmp_path):
    res = _cli("export", "model=tiny-gemma3")
    assert res.returncode == 2 and "missing out=..." in res.stderr
    res = _cli("export", "model=tiny-gemma3", f"out={tmp_path / 'x'}", "variant=weird")
    assert res.returncode == 2 and "variant='weird'" in res.stderr
    res = _cli("export", "model=tiny-gemma3", f"out={tmp_path / 'x'}", "colour=red")
    assert res.returncode == 2 and "unknown key 'colour'" in res.stderr
    res = _cli("export", "model=google/gemma-3-1b-it", f"out={tmp_path / 'y'}")
    assert res.returncode == 2 and "cannot load model" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "y").exists()
