"""patch_match's figures: readable token labels (a real tokenizer's text, not ids) and the paper's
bfloat16 numbers drawn only where they compare."""

from __future__ import annotations

import pandas as pd

from experiments.goldwaser.patch_match_plots import _paper_bf16, tick_labels


def test_tokens_are_shown_as_text_with_whitespace_visible_and_ids_only_where_unreadable():
    rows = pd.DataFrame({"token": ["Explain", " the", "\n", "\x07", "a\ufffd", "$5"], "token_id": [1, 2, 3, 4, 5, 6]})
    assert tick_labels(rows) == ["Explain", "␣the", "↵", "#4", "#5", r"\$5"]


def test_the_paper_numbers_belong_to_bfloat16_series_of_its_two_variants():
    assert _paper_bf16("bfloat16 naive") == 87.5
    assert _paper_bf16("gemma-3-270m bfloat16 stable") == 98.0
    assert _paper_bf16("float32 naive") is None and _paper_bf16("bfloat16 closed_loop") is None
