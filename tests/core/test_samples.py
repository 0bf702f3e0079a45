"""samples.jsonl: every run that generates text writes, per prompt and token position, the with-context,
patched and control top-1 tokens (ids and text), their agreement and logit distances (system_compile: whole
replies); `icl-exp show RUN_DIR` prints them side by side, mismatches highlighted."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from cli.show import tables
from experiments.core.samples import SAMPLES_FILE, read_samples, reply_sample, token_sample
from tests.helpers.cli import run_cli


class _Tokenizer:
    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_token_sample_holds_the_three_top1_tokens_their_agreement_and_distances():
    context = torch.tensor([0.0, 3.0, 1.0])
    patched = torch.tensor([0.0, 2.5, 1.0])  # the same top-1, 0.5 away
    control = torch.tensor([4.0, 0.0, 0.0])  # another top-1
    s = token_sample(_Tokenizer(), 2, context, patched, control, generated=2, prompt=1, position=9)
    assert (s["prompt"], s["position"], s["step"]) == (1, 9, 2)
    assert s["generated"] == {"id": 2, "text": "c"} and s["context"] == {"id": 1, "text": "b"}
    assert s["patched"]["id"] == 1 and s["control"] == {"id": 0, "text": "a"}
    assert s["top1_agree"] and not s["control_top1_agree"]
    assert s["logit_linf"] == 0.5 and math.isclose(s["logit_linf_rel"], 0.5 / 3.0)
    assert 0 < s["tvd"] < s["control_tvd"] <= 1
    same = token_sample(None, 0, context, context.clone())
    assert same["tvd"] == 0.0 and same["control"] is None and "control_top1_agree" not in same
    json.dumps(s)  # one JSON line


def test_show_highlights_a_patched_token_that_differs():
    rows = [token_sample(_Tokenizer(), k, torch.tensor([0.0, 1.0]), torch.tensor([k / 2, 0.6]), prompt=0,
                         position=5 + k) for k in range(3)]  # step 2: the patched top-1 is token 0
    [table] = tables(rows)
    assert "top-1 agrees 2/3" in table.title
    patched = list(table.columns[2]._cells)
    assert patched[:2] == ["b", "b"] and patched[2].startswith("[bold red]")
    [only] = tables(rows, mismatches_only=True)
    assert len(list(only.columns[0]._cells)) == 1
    [replies] = tables([reply_sample("hi there", "hi there", "yo", system="s", method="m", query=0, prompt="Hi?")])
    assert "reply is the with-context one 1/1, control 0/1" in replies.title


def _agree(run_dir, metric: str, keys: dict[str, str]) -> None:
    """The samples' top-1 agreement is the metrics' own (`metric`, per token) at every position; `keys`: a
    sample's index key -> the metrics' column."""
    samples = pd.DataFrame(read_samples(run_dir / SAMPLES_FILE))
    m = pd.read_csv(run_dir / "metrics.csv")
    m = m[m.metric == metric][[*keys.values(), "value"]].rename(columns={v: k for k, v in keys.items()})
    assert len(samples) == len(m) > 0
    merged = samples.merge(m, on=list(keys))
    assert len(merged) == len(samples)
    assert (merged["top1_agree"] == (merged["value"] == 1.0)).all()


@pytest.mark.parametrize("name, metric, keys", [
    ("patch_match", "top1_match", {"prompt": "prompt", "step": "step"}),
    ("gemma_match", "top1_match", {"prompt": "prompt", "step": "step"}),
    ("layer_errors", "top1_match", {"dtype": "dtype", "variant": "variant", "prompt": "prompt", "step": "token"}),
])
def test_generating_runs_write_samples_that_agree_with_their_metrics(smoke_runs, name, metric, keys):
    run_dir = smoke_runs(name)
    _agree(run_dir, metric, keys)
    first = read_samples(run_dir / SAMPLES_FILE)[0]
    assert first["context"]["text"] and first["control"] is not None and first["position"] > first["step"]
    out = run_cli("show", str(run_dir))
    assert out.returncode == 0 and "top-1 agrees" in out.stdout, out.stderr[-2000:]


def test_system_compile_folds_its_generations_into_samples(smoke_runs):
    run_dir = smoke_runs("system_compile")
    generations = json.loads((run_dir / "generations.json").read_text())
    samples = read_samples(run_dir / SAMPLES_FILE)
    for s in samples:
        texts = generations["system"][s["system"]]
        i = s["query"] - (len(generations["fit"]) if s["split"] == "heldout" else 0)
        assert s["context"]["text"] == texts["reference"][s["split"]][i]
        assert s["patched"]["text"] == texts[s["method"]][s["split"]][i]
        assert s["control"]["text"] == texts["control"][s["split"]][i]
        assert s["top1_agree"] == (s["patched"]["text"] == s["context"]["text"])
    methods = [m for m in next(iter(generations["system"].values())) if m not in ("reference", "control")]
    assert len(samples) == len(generations["system"]) * len(methods) * (len(generations["fit"]) +
                                                                       len(generations["heldout"]))


def test_show_on_a_folder_without_samples_is_one_line(smoke_runs, tmp_path):
    for folder, message in ((tmp_path / "nowhere", "no such folder"),
                            (smoke_runs("cov_rate"), "has no samples.jsonl (only runs that generate text")):
        out = run_cli("show", str(folder))
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
            out.stderr
