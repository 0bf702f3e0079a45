"""docs/papers.md's verdicts are computed from the runs' claims, never typed: a failing claim makes an item
`differs`, passing ones `reproduced` at the paper's preset and `reproduced at a smaller scale` below it, an item
without a run `not run here` with what it needs; and the numbers a page quotes come from results/ or stop it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments.core.errors import UserError
from experiments.core.report.papers_page import render_papers_page
from experiments.core.report.quoted import fill, quote
from experiments.core.results_root import find_units


def run(folder, experiment, preset, claims):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"experiment": experiment, "status": "complete", "preset": preset,
                                                 "overrides": [f"experiment={experiment}"], "wall_time_s": 75}))
    (folder / "metrics.csv").write_text("experiment,run_id,metric,value,n\n"
                                        f"{experiment},x,slope,-0.5,1\n{experiment},x,slope,-1.5,2\n")
    pd.DataFrame([dict(id=i, ref="r", description="d", paper_value="", measured=m, tolerance=0.1, comparison="<=",
                       passed=m <= 0.1) for i, m in claims]).to_csv(folder / "claims.csv", index=False)


def item(name, experiment, claims, **more):
    return {"paper": "xu_fang", "item": name, "kind": "figure", "shows": "s", "paper_value": "", "paper_scale": "p",
            "experiment": experiment, "claims": claims, "figure": None, "needs": "", **more}


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results"
    run(root / "cov_rate" / "paper", "cov_rate", "paper", [("xu_fang.a.one", 0.01), ("xu_fang.a.two", 0.5)])
    run(root / "cov_alignment" / "cpu", "cov_alignment", "cpu", [("xu_fang.b.d32", 0.01), ("xu_fang.b.d64", 0.02)])
    return root


def verdicts(results, items):
    page = render_papers_page(items, results, find_units(results), set())
    rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    return [row.split(" | ")[-1].split("**")[1] for row in rows]


def test_verdicts_follow_the_claims(results):
    items = [item("passes at paper", "cov_rate", ["xu_fang.a.one"]),
             item("fails", "cov_rate", ["xu_fang.a.*"], reason="measured why"),
             item("passes at cpu", "cov_alignment", ["xu_fang.b.d*"]),
             item("no run", "markov_collapse", ["xu_fang.c.x"]),
             item("no experiment", None, [], needs="a GPU")]
    assert verdicts(results, items) == ["reproduced", "differs", "reproduced at a smaller scale", "not run here",
                                        "not run here"]
    page = render_papers_page(items, results, find_units(results), set())
    assert "measured why" in page and "needs a GPU" in page and "`icl-exp run markov_collapse`" in page


def test_quoted_numbers_come_from_the_runs_or_stop_the_page(results):
    assert quote(results, "cov_rate/paper", "xu_fang.a.two") == "0.5"
    assert quote(results, "cov_rate/paper", "claims") == "1/2"
    assert quote(results, "cov_rate/paper", "wall") == "1 min 15 s"
    assert quote(results, "cov_rate/paper", "metric:slope:min", ".2f") == "-1.50"
    assert quote(results, "cov_rate/paper", "metric:slope:max:n=1", ".1f") == "-0.5"
    text = "a <!-- q: cov_rate/paper xu_fang.a.one .1e -->9<!-- /q --> b"
    assert fill(text, results) == "a <!-- q: cov_rate/paper xu_fang.a.one .1e -->1.0e-2<!-- /q --> b"
    bad = (("cov_rate/paper", "xu_fang.nope"), ("nope/paper", "claims"), ("cov_rate/paper", "metric:x:max"))
    for unit, what in bad:
        with pytest.raises(UserError):
            quote(results, unit, what)


def slope_table(folders) -> str:
    """A table function for a page's `table:` marker: the runs' slopes, one row each."""
    from experiments.core.results import read_metrics

    rows = [f"| {f.name} | {read_metrics(f)['value'].min():.1f} |" for f in folders]
    return "\n".join(["| run | min slope |", "|---|---|", *rows])


def test_a_generated_table_is_written_again_from_the_runs(results):
    head = "<!-- table: tests.core.test_papers_page:slope_table cov_rate/paper -->\n"
    page = f"before\n{head}| typed | by hand |\n<!-- /table -->\nafter"
    assert fill(page, results) == (f"before\n{head}| run | min slope |\n|---|---|\n| paper | -1.5 |\n"
                                   "<!-- /table -->\nafter")
    with pytest.raises(UserError, match="no run or sweep"):
        fill(page.replace("cov_rate/paper", "cov_rate/nope"), results)
