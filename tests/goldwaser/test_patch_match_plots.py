"""patch_match's figures: readable token labels (a real tokenizer's text, not ids) and the paper's
bfloat16 numbers drawn only where they compare."""

from __future__ import annotations

import pandas as pd

from experiments.goldwaser.patch_match.plots import _paper_bf16, tick_labels


def test_tokens_are_shown_as_text_with_whitespace_visible_and_ids_only_where_unreadable():
    rows = pd.DataFrame({"token": ["Explain", " the", "\n", "\x07", "a\ufffd", "$5"], "token_id": [1, 2, 3, 4, 5, 6]})
    assert tick_labels(rows) == ["Explain", "␣the", "↵", "#4", "#5", r"\$5"]


def test_the_paper_numbers_belong_to_bfloat16_series_of_its_two_variants():
    assert _paper_bf16("bfloat16 naive") == 87.5
    assert _paper_bf16("gemma-3-270m bfloat16 stable") == 98.0
    assert _paper_bf16("float32 naive") is None and _paper_bf16("bfloat16 closed_loop") is None
    assert _paper_bf16("bfloat16 action own-text naive") == 87.5


def test_the_ways_table_counts_tokens_per_way_with_wilson_intervals(tmp_path):
    """Two runs (materialized and action) of 4 and 5 tokens: matches, %, the interval of k of n, the largest
    logit error and per-layer error, each way its own row; the figure is drawn from the same frame."""
    from experiments.goldwaser.patch_match.plots import plot, ways_table

    rows = []
    for apply, hits, rel in (("materialized", [1, 1, 0, 1], 0.2), ("action", [1, 1, 1, 1, 1], 0.01)):
        for step, hit in enumerate(hits):
            base = dict(model="m", family="Llama", dtype="bfloat16", variant="naive", apply=apply, advance="context",
                        context="text", prompt=0, step=step, token="t", token_id=step, run_id=apply)
            rows += [dict(base, metric="top1_match", value=float(hit)), dict(base, metric="logit_linf_rel", value=rel),
                     dict(base, metric="logit_linf", value=rel), dict(base, metric="tvd", value=rel / 2),
                     dict(base, metric="hidden_rel", value=rel * step, layer=0)]
    metrics = pd.DataFrame(rows)
    t = ways_table(metrics).set_index("apply")
    assert t.loc["materialized", "matches"] == 3 and t.loc["materialized", "tokens"] == 4
    assert t.loc["materialized", "top1_pct"] == 75.0
    lo, hi = t.loc["materialized", ["top1_lo_pct", "top1_hi_pct"]]
    assert round(lo, 1) == 30.1 and round(hi, 1) == 95.4  # Wilson's interval of 3 of 4, by hand
    assert t.loc["action", "top1_hi_pct"] == 100.0 and t.loc["action", "max_rel_linf"] == 0.01
    assert t.loc["materialized", "max_hidden_rel"] == 0.2 * 3
    assert any(p.name == "bf16_ways.png" for p in plot(metrics, tmp_path))
    # a run the witness judged: its per-layer errors are the witness's, the other run keeps the pass's
    judged = metrics[(metrics["metric"] == "hidden_rel") & (metrics["apply"] == "action")].assign(
        metric="witness_hidden_rel", value=0.5)
    t = ways_table(pd.concat([metrics, judged])).set_index("apply")
    assert t.loc["action", "max_hidden_rel"] == 0.5 and t.loc["materialized", "max_hidden_rel"] == 0.2 * 3


def test_the_margin_at_a_miss_is_read_from_the_same_model_when_run_ids_repeat_across_sweeps():
    """Two sweeps each have a job "bf16-0": the with-context margin at a miss must come from the model that
    missed, and the docs' table prints it."""
    from experiments.goldwaser.bf16_ways import markdown
    from experiments.goldwaser.patch_match.plots import ways_table

    rows = []
    for model, hit, margin in (("a", 0.0, 0.25), ("b", 1.0, 3.0)):
        base = dict(model=model, dtype="bfloat16", variant="naive", apply="materialized", advance="context",
                    run_id="bf16-0", prompt=0, step=0)
        rows += [dict(base, metric="top1_match", value=hit), dict(base, metric="context_margin", value=margin),
                 dict(base, metric="logit_linf_rel", value=0.01), dict(base, metric="tvd", value=0.01),
                 dict(base, metric="hidden_rel", value=0.01, layer=0)]
    t = ways_table(pd.DataFrame(rows)).set_index("model")
    assert t.loc["a", "max_margin_at_misses"] == 0.25 and pd.isna(t.loc["b", "max_margin_at_misses"])
    text = markdown(t.reset_index())
    assert "| a | bfloat16 | naive | materialized | context | 0/1 |" in text and "| 0.25 |" in text
