"""`icl-exp patch compile ... format=peft`: the compiled change as a PEFT LoRA adapter that any peft user loads
with `AutoPeftModelForCausalLM.from_pretrained(DIR)` alone, in a fresh process, and that gives the merged
checkpoint's logits, for a Llama-, a Gemma- and a GPT-2-shaped (Conv1D) tiny model; the base named by the
absolute path of a local folder, or written into base/ for a model no loader finds by name; and every
refusal one line, before any model is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers.cli import OFFLINE, run_cli
from tests.helpers.repo import REPO_ROOT

SYSTEM = ("system=Begin every answer with the word 'Ahoy'.", "check=starts_with:Ahoy")
TINY = ("queries=[Hi?,Why?,How so?,What now?]", "heldout=2", "max_new_tokens=5", "rank=2", "steps=3", "batch=2")

# What a user runs, in a fresh interpreter that imports nothing of this project, from another directory: the
# adapter alone, then the merged checkpoint and the base the adapter names, on the held-out queries' ids
# (prompt and reply); the largest logit gaps and the merged logits' scale, as JSON.
FRESH = """
import json, sys, torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM
adapter_dir, merged_dir = sys.argv[1:3]
adapted = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32).eval()
merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
base = AutoModelForCausalLM.from_pretrained(adapted.peft_config["default"].base_model_name_or_path,
                                            dtype=torch.float32).eval()
gap, base_gap, scale = 0.0, 0.0, 0.0
for q in json.load(open(adapter_dir + "/compiled.json"))["queries"]:
    ids = torch.tensor([q["plain_ids"] + q["reply_ids"]])
    with torch.no_grad():
        want, got, plain = merged(ids).logits, adapted(ids).logits, base(ids).logits
    gap = max(gap, float((got - want).abs().max()))
    base_gap = max(base_gap, float((plain - want).abs().max()))
    scale = max(scale, float(want.abs().max()))
print(json.dumps(dict(gap=gap, base_gap=base_gap, scale=scale, cls=type(adapted).__name__)))
"""


def compile_both(tmp_path, model: str, method: str, extra: tuple[str, ...], cwd=REPO_ROOT):
    """The merged checkpoint and the adapter of the same compile (same seed: the same change)."""
    merged_dir, peft_dir = tmp_path / "merged", tmp_path / "peft"
    for out, fmt in ((merged_dir, "merged"), (peft_dir, "peft")):
        res = run_cli("patch", "compile", f"method={method}", *SYSTEM, f"model={model}", *TINY, *extra,
                      f"format={fmt}", f"out={out}", cwd=cwd)
        assert res.returncode == 0, res.stderr[-3000:]
    return merged_dir, peft_dir


def fresh_logits(tmp_path, peft_dir, merged_dir) -> dict:
    elsewhere = tmp_path / "elsewhere"  # not the run's folder, not the repository: the paths must hold anywhere
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # peft and transformers, not this project
    res = subprocess.run([sys.executable, "-c", FRESH, str(peft_dir), str(merged_dir)], cwd=elsewhere,
                         env={**env, **OFFLINE}, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("model, method, extra", [
    ("tiny-llama", "bake", ()),
    ("tiny-gemma3", "bake", ()),  # its analytic patch changes a norm's scale: refused below
    ("tiny-gpt2", "bake", ("lora_targets=[c_attn,c_fc,c_proj]",)),  # Conv1D: fan_in_fan_out
])
def test_autopeft_loads_the_adapter_in_a_fresh_process_and_gives_the_merged_logits(tmp_path, model, method, extra):
    merged_dir, peft_dir = compile_both(tmp_path, model, method, extra)
    assert (peft_dir / "adapter_model.safetensors").stat().st_size < (merged_dir / "model.safetensors").stat().st_size
    assert not (peft_dir / "model.safetensors").exists()  # the base is in base/, not mistaken for the adapter's
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    # a random model exists nowhere else: its base is written beside the adapter, which names it absolutely
    assert config["base_model_name_or_path"] == str((peft_dir / "base").resolve())
    assert config["fan_in_fan_out"] is (model == "tiny-gpt2")
    assert "base/" in (peft_dir / "README.md").read_text()
    claims = pd.read_csv(peft_dir / "claims.csv").set_index("id")
    assert bool(claims.loc["system_compile.checkpoint.reproduced", "passed"])

    got = fresh_logits(tmp_path, peft_dir, merged_dir)
    assert got["cls"] == "PeftModelForCausalLM"
    # float32: the merged checkpoint holds W + ΔW rounded once; peft computes W x + B (A x), rounded along
    # another path. Through 4 layers that is rounding level: measured 4e-7 to 8e-7 of the logits' scale here,
    # 1.6e-6 for the analytic patch below (a larger ΔW); 1e-4 leaves that fifty times the room and stays four
    # orders below what the change moves (base_gap: 4e-2 to 1 of the scale)
    assert got["gap"] <= 1e-4 * got["scale"], got
    assert got["base_gap"] > 100 * got["gap"], got  # the adapter is what moved them: the base alone is far off


def test_the_adapter_of_a_local_folder_names_its_absolute_path_and_writes_no_base(tmp_path):
    """The analytic patch (Llama's outer weight), on a checkpoint folder given by a path relative to where the
    command ran: the adapter must name it absolutely, for a user who loads it from anywhere else."""
    from experiments.patching.load import build_offline
    from tests.helpers.checkpoints import checkpoint_folders

    checkpoint_folders(tmp_path, ["tiny-llama"], lambda name, _vocab: build_offline(name, 0)[0])
    (tmp_path / "tiny-llama").rename(tmp_path / "ckpt")  # not an offline model's name
    merged_dir, peft_dir = compile_both(tmp_path, "ckpt", "analytic", ("analytic_rank=2",), cwd=tmp_path)
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "ckpt").resolve())
    assert not (peft_dir / "base").exists()
    got = fresh_logits(tmp_path, peft_dir, merged_dir)
    assert got["gap"] <= 1e-4 * got["scale"] and got["base_gap"] > 100 * got["gap"], got  # the bound: above


def test_the_base_is_named_by_hub_id_or_absolute_folder_and_written_only_where_no_loader_finds_it(tmp_path,
                                                                                                   monkeypatch):
    """adapter_base's choice, without a model: a hub id as it is; a folder given relatively, absolutely; an
    offline random model, a bundled GGUF and a GGUF file: base/ beside the adapter (written_base says why)."""
    from experiments.goldwaser.system_compile.adapter_base import base_name, written_base

    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert base_name("Qwen/Qwen2.5-0.5B-Instruct", run) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert base_name("ckpt", run) == str((tmp_path / "ckpt").resolve())
    for model in ("tiny-llama", "qwen2.5-0.5b", "gemma-3-270m", "weights/my-model.Q4_K_M.gguf"):
        assert written_base(model) and base_name(model, run) == str((run / "base").resolve()), model
    assert written_base("ckpt") is None and written_base("Qwen/Qwen2.5-0.5B-Instruct") is None


# -- refusals: one line, exit 2, no run folder, and no model built or loaded ---------------------------
@pytest.fixture
def no_model_loaded(monkeypatch):
    """Loading or building any model's weights fails the test: a refusal must come before."""
    from experiments.zoo import loading

    def never(*_a, **_k):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(loading, "build_offline", never)  # what patching.load.build_offline calls
    monkeypatch.setattr(loading, "_from_pretrained", never)


@pytest.mark.parametrize("model, what", [
    ("tiny-gemma3", "the analytic patch of Gemma 3 changes post_feedforward_layernorm.weight (Gemma3RMSNorm.weight"),
    ("tiny-gpt2", "the analytic patch of GPT-2 changes mlp.c_proj.bias (Conv1D.bias"),
    # its router is a module of its own, not a Linear (transformers 5), and its experts a stacked tensor
    ("tiny-mixtral", "the analytic patch of Mixtral changes mlp.gate.weight (MixtralTopKRouter.weight"),
])
def test_a_family_whose_analytic_patch_no_lora_holds_is_refused_before_loading(tmp_path, no_model_loaded, model,
                                                                              what):
    from tests.helpers.in_process import refusal

    text = refusal("system_compile", tmp_path / "run", f"model={model}", "methods=[analytic]", "save=analytic",
                   "format=peft", "analytic_rank=2")
    assert f"format=peft: {what}" in text and "use format=merged, or method=bake" in text


def test_a_lora_target_that_is_no_linear_module_is_refused_before_loading(tmp_path, no_model_loaded):
    from tests.helpers.in_process import refusal

    text = refusal("system_compile", tmp_path / "run", "save=bake", "format=peft", "lora_targets=[embed_tokens]")
    assert "format=peft: lora_targets=embed_tokens names model.embed_tokens (Embedding)" in text


def test_peft_for_an_analytic_patch_that_is_not_low_rank_says_what_rank_it_would_take(tmp_path):
    res = run_cli("patch", "compile", "method=analytic", *SYSTEM, "model=tiny-llama", *TINY, "format=peft",
                  f"out={tmp_path / 'x'}")
    assert res.returncode == 2 and "format=peft: the analytic patch is not low rank (up to rank" in res.stderr
    assert "give analytic_rank=R" in res.stderr and not (tmp_path / "x").exists()


def test_peft_without_a_saved_method_is_refused(tmp_path):
    from tests.helpers.in_process import refusal

    assert "give save=analytic|bake with it" in refusal("system_compile", tmp_path / "run", "format=peft")
