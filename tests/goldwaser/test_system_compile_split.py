"""system_compile's split by meaning: queries that a reader calls one query (a question mark, a contraction, a
zero-width space, case, a typing slip) are refused across fit, validation and held-out and within each, in one
line before any model is loaded; distinct queries, the default pool's included, pass. And a validation split
with one budget point still scores it and logs the bake's curve there."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.goldwaser.system_compile.duplicates import near_duplicates, normal, same_query

API = "What is an API"


@pytest.mark.parametrize("other", ["What is an API?", "What's an API?", "what is an\u200b API", "WHAT IS AN API",
                                   "  What   is an API ", "What\u2019s an API?", "What is an API\ufeff",
                                   "What is an «API»"])
def test_a_query_and_its_rewording_by_bytes_are_one_query(other):
    assert same_query(API, other) and normal(other) == "what is an api"


@pytest.mark.parametrize("a, b", [("How do I read a file line by line in Python?",
                                   "How do I read a file line by line in Pyhton?"),  # a slip, 44 characters
                                  ("How can I sort a dictionary by its values?",
                                   "How can I sort a dictionary by it's values")])
def test_a_typing_slip_in_a_long_query_is_the_same_query(a, b):
    assert same_query(a, b)


@pytest.mark.parametrize("a, b", [(API, "What is an APP?"), ("What is Git used for?", "What is Go used for?"),
                                  ("How do I read a file line by line in Python?",
                                   "How do I read a file line by line in Rust?"),
                                  ("How do I reverse a list?", "How do I sort a list?")])
def test_distinct_queries_are_not_duplicates(a, b):
    assert not same_query(a, b)


def test_the_default_pool_and_the_cpu_presets_queries_are_distinct():
    from experiments.goldwaser.system_compile.queries import QUERIES
    from tests.helpers.in_process import compose

    assert near_duplicates({"fit": list(QUERIES)}) == []
    assert near_duplicates({"fit": list(compose("system_compile", preset="cpu").queries)}) == []


def test_pairs_are_found_across_and_within_groups_each_once():
    pairs = near_duplicates({"fit": ["Hi?", "Why?"], "validation": ["why"], "held-out": ["How?", "how", "hi"]})
    assert pairs == [("fit", "Hi?", "held-out", "hi"), ("fit", "Why?", "validation", "why"),
                     ("held-out", "How?", "held-out", "how")]


@pytest.mark.parametrize("queries, extra, said", [
    (["Hi?", "Why?", "How so?", "What now?", "What is an API", "What's an API?"], (),
     "held-out query \"What's an API?\" repeats held-out query 'What is an API'"),
    (["Hi?", "Why?", "How so?", "hi", "What now?"], (), "held-out query 'hi' repeats fit query 'Hi?'"),
    (["Hi?", "Why?", "How so?", "What now?", "Who?", "who\u200b"], (), "repeats held-out query 'Who?'"),
    (["Hi?", "Why?", "How so?", "why", "Who?", "When?"], ("validation=1", "heldout=2"),
     "validation query 'why' repeats fit query 'Why?'"),
    (["Hi?", "hi!", "How so?", "What now?", "Who?"], (), "fit query 'hi!' repeats fit query 'Hi?'"),
])
def test_a_query_file_with_near_duplicates_is_one_line_before_any_model(tmp_path, queries, extra, said):
    from tests.helpers.in_process import refusal

    path = tmp_path / "queries.txt"
    path.write_text("\n".join(queries) + "\n", encoding="utf-8")
    text = refusal("system_compile", tmp_path / "run", f"queries={path}", *extra)
    assert said in text and "give distinct queries" in text


def test_a_query_list_with_a_duplicate_is_refused(tmp_path):
    from tests.helpers.in_process import refusal

    said = refusal("system_compile", tmp_path / "run", "queries=[What is a closure?,Why?,How so?,what is a closure]",
                   "heldout=1")
    assert "held-out query 'what is a closure' repeats fit query 'What is a closure?'" in said


def test_one_budget_point_under_validation_logs_its_validation_kl_and_curve(tmp_path):
    """validation=1 and each method at its one point: nothing to choose, but the point is compiled on the other
    fit queries and scored on the validation query (validation_kl), and the bake's curve is there."""
    from tests.helpers.in_process import run_claims

    run_claims("system_compile", tmp_path / "run", "validation=1", "eval_every=1")
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    val = m[m["metric"] == "validation_kl"]
    assert sorted(val["method"]) == ["analytic", "bake"] and (val["split"] == "validation").all()
    curve = m[m["metric"] == "bake_eval_kl"]
    assert len(curve) and set(curve["split"]) == {"validation"}
