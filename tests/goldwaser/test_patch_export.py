"""`icl-exp patch export`: a patched Hugging Face checkpoint that stock transformers loads and that,
fed the prompt's last token alone, gives the original model's next-token logits for the whole prompt,
for every architecture."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from experiments.patching.arch import TINY_MODELS
from experiments.patching.compare import rounding_bar
from tests.helpers.cli import OFFLINE, run_cli


def changed_parameters(model: str, variant: str) -> set[str]:
    """The parameters an export changes in each layer: the adapter's input matrices and its output rule's
    parameter, and W_down before a post-MLP norm for every variant but naive (the stable update and the closed
    loop change it too)."""
    adapter = TINY_MODELS[model]
    extra = [adapter.pre_norm_matrix] if adapter.pre_norm_matrix and variant != "naive" else []
    return {*adapter.input_matrices, adapter.output_param, *extra}


# Gemma 3's open loops beside every family's closed loop
CASES = [("tiny-gemma3", "naive"), ("tiny-gemma3", "stable"), *((name, "closed_loop") for name in TINY_MODELS)]


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`icl-exp patch ARGS`, offline."""
    return run_cli("patch", *args, env=OFFLINE)


FAST = {("tiny-gemma3", "stable"), ("tiny-llama", "closed_loop")}  # the rest: @slow (a subprocess each)


@pytest.mark.parametrize("model, variant", [p if p in FAST else pytest.param(*p, marks=pytest.mark.slow)
                                            for p in CASES])
def test_export_round_trip_through_stock_transformers(tmp_path, model, variant):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "export"
    res = _cli("export", f"model={model}", "prompt=Write a haiku about snow.", f"variant={variant}", f"out={out}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    inputs = json.loads((out / "inputs.json").read_text())
    assert (out / "patched" / "model.safetensors").is_file() and (out / "patched" / "config.json").is_file()
    kw = TINY_MODELS[model].load_kwargs  # what the adapter asks of the loader (Mixtral: experts run eagerly)
    base = AutoModelForCausalLM.from_pretrained(out / "base", **kw).eval()
    patched = AutoModelForCausalLM.from_pretrained(out / "patched", **kw).eval()
    ids = torch.tensor([[*inputs["context_ids"], inputs["query_id"]]])
    query = torch.tensor([[inputs["query_id"]]])
    with torch.no_grad():
        want = base(ids).logits[0, -1]
        got = patched(query).logits[0, -1]
        control = base(query).logits[0, -1]
    assert int(got.argmax()) == int(want.argmax()) == inputs["reference_top1"]
    level = 1e-2 if variant == "naive" else 1e-4  # naive Gemma: Δm amplifies float32 rounding (open loop)
    assert (got - want).abs().max() < level * want.abs().max()
    assert (control - want).abs().max() > 0.1  # without the patch the token alone does not do it
    changed = [k for k, v in patched.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert {k.split(".", 3)[-1] for k in changed} == changed_parameters(model, variant)


def _export_refusal(*args: str) -> str:
    """`icl-exp patch export ARGS` in this process (no interpreter to start per case): its one error line."""
    from tests.helpers.cli import invoke_in_process

    result = invoke_in_process("patch", "export", *args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr


def test_export_errors_are_one_line_and_leave_nothing(tmp_path):
    assert "variant='weird'" in _export_refusal("model=tiny-gemma3", f"out={tmp_path / 'x'}", "variant=weird")
    assert "unknown config key 'colour'" in _export_refusal("model=tiny-gemma3", f"out={tmp_path / 'x'}", "colour=red")
    assert "needs a post-MLP norm" in _export_refusal("model=tiny-llama", f"out={tmp_path / 'x'}", "variant=stable")
    assert "cannot load model" in _export_refusal("model=google/gemma-3-1b-it", f"out={tmp_path / 'y'}")
    folder = tmp_path / "no_config"
    folder.mkdir()
    assert "without config.json" in _export_refusal(f"model={folder}", f"out={tmp_path / 'z'}")
    assert not any((tmp_path / d).exists() for d in ("x", "y", "z"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_export_control_fails_when_the_checkpoint_is_not_patched(tmp_path, monkeypatch, dtype):
    """The bfloat16 export's only claim was top-1 agreement, which an unpatched model often has too. Its
    control: the exported checkpoint must be far closer to the with-context logits than the unpatched
    model on the query alone. Exporting the unpatched model (RUN/base copied over RUN/patched) fails it."""
    import shutil

    from experiments.patching import export
    from tests.helpers.in_process import run_claims

    args = ("model=tiny-llama", "variant=closed_loop", f"dtype={dtype}", "prompt=Write a haiku about snow.")
    claim = "goldwaser.construction.export.control_differs"  # a closed loop's export is a construction
    real = run_claims("patch_export", tmp_path / "real", *args)
    assert real.loc[claim, "passed"] and real.loc["goldwaser.construction.export.top1_reproduced", "passed"]
    patch = export.export_patched

    def unpatched(bundle, prompt, out_dir, *rest):
        summary = patch(bundle, prompt, out_dir, *rest)
        shutil.copytree(out_dir / "base", out_dir / "patched", dirs_exist_ok=True)
        return summary

    monkeypatch.setattr(export, "export_patched", unpatched)
    broken = run_claims("patch_export", tmp_path / "unpatched", *args)
    assert not broken.loc[claim, "passed"] and abs(broken.loc[claim, "measured"]) < 0.1  # the same model twice


def test_a_closed_loop_export_is_a_construction_with_its_control_and_per_layer_claims(tmp_path):
    """A closed loop's export gets construction ids only, its last-layer control (the same logits) and the
    per-layer error against the record that tells the two apart; an open loop's export keeps the evidence ids."""
    from tests.helpers.in_process import run_claims

    closed = run_claims("patch_export", tmp_path / "closed", "model=tiny-llama", "variant=closed_loop",
                        "dtype=float64", "prompt=Write a haiku about snow.")
    own = [i for i in closed.index if not i.startswith("goldwaser.record.")]  # (the with-context side's)
    assert all(i.startswith("goldwaser.construction.export.") for i in own), list(closed.index)
    for name in ("every_layer", "every_layer_control", "last_layer_control_logits", "logits_reproduced"):
        assert closed.loc[f"goldwaser.construction.export.{name}", "passed"], closed.loc[:, "measured"]
    assert closed.loc["goldwaser.construction.export.logits_reproduced", "tolerance"] == rounding_bar("float64")
    naive = run_claims("patch_export", tmp_path / "naive", "model=tiny-llama", "variant=naive", "dtype=float64",
                       "prompt=Write a haiku about snow.")
    assert all(i.startswith(("goldwaser.export.", "goldwaser.record.")) for i in naive.index), list(naive.index)
    assert naive.loc["goldwaser.export.logits_reproduced", "measured"] <= 1e-12  # a float64 reload, float64 end to end


def test_a_float64_reload_computes_as_the_model_that_saved_it(tmp_path):
    """A float64 checkpoint reloaded by stock from_pretrained computes its rotary tables and norms in float32
    (1.7e-7 off on tiny-llama); `reload_float64` gives it the project's float64 steps: the same logits to 1e-12."""
    from transformers import AutoModelForCausalLM

    from experiments.core.atomic import save_pretrained
    from experiments.patching.compare import logit_comparison
    from experiments.patching.load import load_checked
    from experiments.zoo.float64 import reload_float64

    bundle = load_checked("tiny-llama", torch.float64)
    save_pretrained(bundle.model, tmp_path / "m")
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 11, 4]])
    with torch.no_grad():
        want = bundle.model(input_ids=ids).logits[0]
        got = reload_float64(tmp_path / "m", torch.float64)(input_ids=ids).logits[0]
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float64)(input_ids=ids).logits[0]
    assert logit_comparison(want, got)["logit_linf_rel"] <= 1e-12
    assert logit_comparison(want, plain)["logit_linf_rel"] > 1e-12  # the control: a plain reload is not float64
