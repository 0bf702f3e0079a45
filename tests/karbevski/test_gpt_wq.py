"""gpt_wq end to end through the real CLI at preset=smoke: the run folder, a resume after a stop that
continues the same loss curve, and the bad inputs (mismatched or corrupt checkpoint, no GPU for the
paper preset, OpenWebText offline), each one line with nothing overwritten."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.helpers.cli import run_cli

SMOKE = ("preset=smoke",)


def run(tmp: Path, name: str, *overrides: str):
    return run_cli("run", "gpt_wq", *SMOKE, f"hydra.run.dir={tmp / name}", f"cache_dir={tmp / 'cache'}", *overrides)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smoke_runs) -> Path:
    """full: 6 steps, the session's shared smoke run (tests/helpers/smoke_runs.py; its data cache shared too);
    stopped: the same run stopped after 3; resumed: stopped continued to 6."""
    tmp = tmp_path_factory.mktemp("gpt_wq")
    (tmp / "full").symlink_to(smoke_runs("gpt_wq"), target_is_directory=True)
    (tmp / "cache").symlink_to(smoke_runs.root / "gpt_wq_cache", target_is_directory=True)
    # the lr schedule's horizon is fixed (decay_steps=6) so the stopped run follows the full run's schedule
    for name, extra in (("stopped", ("train.steps=3",)), ("resumed", (f"resume={tmp / 'stopped'}",))):
        result = run(tmp, name, "train.decay_steps=6", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    return tmp


def curve(run_dir: Path, metric: str) -> pd.Series:
    m = pd.read_csv(run_dir / "metrics.csv")
    return m[m["metric"] == metric].set_index("step")["value"]


def test_run_folder(runs):
    run_dir = runs / "full"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "complete"
    claims = pd.read_csv(run_dir / "claims.csv")
    assert claims["passed"].all(), claims
    assert set(claims["id"]) == {"karbevski.table2.total_params.baseline_124m",
                                 "karbevski.table2.non_embedding_params.baseline_124m",
                                 "karbevski.export.gpt2_logits_match.baseline_124m"}
    assert list(curve(run_dir, "val_loss").index) == [0, 3, 6]
    assert list(curve(run_dir, "train_loss").index) == [1, 2, 3, 4, 5, 6]
    assert curve(run_dir, "tokens_seen")[6] == 6 * 4 * 2 * 32  # steps x micro-batch x accumulation x block
    assert (curve(run_dir, "tokens_per_s") > 0).all()
    table = pd.read_csv(run_dir / "figures" / "table2.csv")
    assert table.loc[0, "variant"] == "baseline_124m" and round(table.loc[0, "paper_shape_params_total_m"], 2) == 124.37
    assert (run_dir / "figures" / "fig1_val_loss.png").is_file()
    assert (run_dir / "hf" / "baseline_124m" / "model.safetensors").is_file()


def test_the_loss_unit_follows_the_tokenizer(runs):
    """Fig. 1's axis says what the loss is per: the smoke run's byte-level text gives nats per byte, GPT-2's BPE
    (the paper's) nats per GPT-2 token; a run from before the tokenizer was logged, per token."""
    from experiments.karbevski.gpt.plots import loss_unit

    m = pd.read_csv(runs / "full" / "metrics.csv")
    assert set(m.loc[m["metric"] == "final_val_loss", "tokenizer"]) == {"bytes"}
    assert loss_unit(m) == "byte"
    assert loss_unit(m.assign(tokenizer="gpt2")) == "GPT-2 token"
    assert loss_unit(m.drop(columns="tokenizer")) == "token"


def test_export_loads_with_auto_classes(runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.data.gpt2_bpe import byte_tokenizer

    folder = runs / "full" / "hf" / "baseline_124m"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    text = "Shall I compare thee to a summer's day?"
    ids = tok(text)["input_ids"]
    assert ids == byte_tokenizer().encode(text) and tok.eos_token_id == 256
    window = ids[: model.config.n_positions]  # the smoke model's context is shorter than the line
    assert model.config.model_type == "gpt2"
    assert model(torch.tensor([window])).logits.shape == (1, len(window), 320)


def test_sweep_draws_fig1_and_table2(tmp_path):
    result = run_cli("run", "gpt_wq", "-m", *SMOKE, "variant=baseline_124m,wq_identity_117m", "export_hf=false",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", f"cache_dir={tmp_path / 'cache'}")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = tmp_path / "sweep" / "figures"
    table = pd.read_csv(figures / "table2.csv")
    assert list(table["variant"]) == ["wq_identity_117m", "baseline_124m"]  # Table 2's column order
    assert table.set_index("variant").loc["wq_identity_117m", "weight_decay"] == 2**-5
    comparisons = pd.read_csv(figures / "table2_comparisons.csv")
    assert list(comparisons["id"]) == ["karbevski.table2.wq_identity_matches_baseline"]
    assert (figures / "fig1_val_loss.png").is_file() and (figures / "table2.png").is_file()


def test_resume_continues_the_same_curve(runs):
    full, resumed = curve(runs / "full", "train_loss"), curve(runs / "resumed", "train_loss")
    stopped = curve(runs / "stopped", "train_loss")
    assert list(stopped.index) == [1, 2, 3]
    assert list(resumed.index) == [1, 2, 3, 4, 5, 6]  # the curve so far is replayed into the new run
    # CPU is deterministic and batches depend on (seed, step) only: the same numbers, not just close
    assert (resumed - full).abs().max() < 1e-6
    assert (curve(runs / "resumed", "val_loss") - curve(runs / "full", "val_loss")).abs().max() < 1e-6
    meta = json.loads((runs / "stopped" / "checkpoints" / "baseline_124m" / "checkpoint.json").read_text())
    assert meta["step"] == 3  # the stopped run's checkpoint was read, not overwritten


def _one_line_failure(result, *needles):
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_resume_of_another_variant_is_refused(runs):
    result = run(runs, "other_variant", f"resume={runs / 'stopped'}", "variant=wq_identity_117m")
    _one_line_failure(result, "another")
    assert not (runs / "other_variant").exists()


def test_truncated_and_corrupt_checkpoints(runs):
    bad = runs / "bad"
    shutil.copytree(runs / "stopped", bad)
    pt = bad / "checkpoints" / "baseline_124m" / "checkpoint.pt"
    data = pt.read_bytes()
    pt.write_bytes(data[: len(data) // 2])
    _one_line_failure(run(runs, "from_truncated", f"resume={bad}"), "truncated")
    assert not (runs / "from_truncated").exists()
    pt.write_bytes(data[:100] + b"\0" * (len(data) - 200) + data[-100:])  # same size, garbage inside
    result = run(runs, "from_corrupt", f"resume={bad}")
    assert result.returncode != 0 and "corrupt" in result.stderr and "Traceback" not in result.stderr
    assert pt.stat().st_size == len(data)  # nothing overwritten
    assert json.loads((runs / "from_corrupt" / "run.json").read_text())["status"] == "failed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_paper_preset_without_gpu_is_one_line(tmp_path):
    result = run_cli("run", "gpt_wq", f"hydra.run.dir={tmp_path / 'paper'}")
    _one_line_failure(result, "needs CUDA")
    assert not (tmp_path / "paper").exists()


def test_openwebtext_offline_is_one_line(tmp_path):
    result = run(tmp_path, "owt", "data=openwebtext", "tokenizer=gpt2", "model.vocab_size=50304")
    _one_line_failure(result, "openwebtext")
    assert not (tmp_path / "owt").exists()


def test_bad_variant_is_one_line(tmp_path):
    _one_line_failure(run(tmp_path, "v", "variant=baseline_99m"), "baseline_124m")
