"""results/ as committed: its runs fit the budget and hold no weights, results/README.md lists every one of
them, every figure in docs/figures names a committed table it was drawn from, and a committed run's figure
draws again from its CSVs alone."""

from __future__ import annotations

import glob
import shutil
import subprocess

import pytest

from experiments.core.results_root import (
    CHECKPOINT_FILES,
    COMMITTED_SUFFIXES,
    MANIFEST,
    SIZE_BUDGET_BYTES,
    find_units,
    manifest_text,
    png_source,
)
from tests.helpers.cli import run_cli
from tests.helpers.repo import REPO_ROOT

RESULTS = REPO_ROOT / "results"
DOC_FIGURES = REPO_ROOT / "docs" / "figures"


def committed(folder):
    """The files git holds under `folder` (a user's own runs beside them are not the repository's)."""
    out = subprocess.run(["git", "ls-files", "-z", str(folder)], cwd=REPO_ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a checkout (a source tree): every file is the repository's
        return [p for p in folder.rglob("*") if p.is_file()]
    return [REPO_ROOT / name for name in out.stdout.split("\0") if name]


def test_results_hold_tables_not_weights_and_fit_the_budget():
    files = committed(RESULTS)
    assert files, "results/ holds no committed run"
    odd = [f.relative_to(REPO_ROOT).as_posix() for f in files
           if not f.name.endswith(COMMITTED_SUFFIXES) and f.name != ".gitkeep" or f.name in CHECKPOINT_FILES]
    assert not odd, f"results/ keeps tables and records only: {odd}"
    assert not [f for f in files if "figures" in f.relative_to(RESULTS).parts], "figures are drawn, not kept"
    size = sum(f.stat().st_size for f in files)
    assert size <= SIZE_BUDGET_BYTES, f"results/ is {size / 2**20:.1f} MB, over the budget"


def test_the_manifest_lists_every_committed_run_as_it_is():
    units = find_units(RESULTS)
    assert units
    assert (RESULTS / MANIFEST).read_text() == manifest_text(RESULTS, units), \
        "results/README.md is stale: redraw with `icl-exp plot results/`"
    for unit in units:
        assert all(r.get("status") == "complete" for r in unit.records()), f"{unit.path} did not complete"


def test_every_docs_figure_names_a_committed_table():
    figures = sorted(DOC_FIGURES.glob("*.png"))
    assert figures
    tracked = {f.relative_to(REPO_ROOT).as_posix() for f in committed(RESULTS)}
    for figure in figures:
        source = png_source(figure)
        assert source, f"{figure.name} says no source: draw it with `icl-exp plot results/`"
        for table in source.split(";"):
            found = [p for p in glob.glob(table, root_dir=REPO_ROOT) if p in tracked]
            assert found, f"{figure.name} was drawn from {table}, which results/ does not hold"


def test_a_committed_run_draws_its_figure_again_from_its_csvs(tmp_path):
    """cov_rate's committed run copied out and drawn by `icl-exp plot RUN`: the same figure as docs/figures'."""
    from PIL import Image

    run = tmp_path / "cov_rate" / "paper"
    shutil.copytree(RESULTS / "cov_rate" / "paper", run, ignore=shutil.ignore_patterns("figures"))
    proc = run_cli("plot", str(run))
    assert proc.returncode == 0, proc.stderr
    drawn = run / "figures" / "cov_rate.png"
    shown = DOC_FIGURES / "cov_rate-paper-cov_rate.png"
    assert png_source(drawn).endswith("cov_rate/paper/metrics.csv")
    with Image.open(drawn) as a, Image.open(shown) as b:
        assert a.size == b.size


def _run(folder, experiment="cov_rate", metrics="experiment,run_id,metric,value\n", commit="abc1234"):
    import json

    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"experiment": experiment, "status": "complete", "preset": "cpu",
                                                 "start": "2026-01-01T00:00:00", "git": {"commit": commit}}))
    (folder / "metrics.csv").write_text(metrics)
    return folder


@pytest.mark.parametrize("case", ["empty", "truncated", "old_layout"])
def test_plot_of_a_results_folder_refuses_in_one_line_and_leaves_docs_as_they_were(tmp_path, case):
    root, docs = tmp_path / "results", tmp_path / "docs"
    (docs / "figures").mkdir(parents=True)
    (docs / "figures" / "kept.png").write_bytes((DOC_FIGURES / "cov_rate-paper-cov_rate.png").read_bytes())
    if case == "empty":
        (root / "cov_rate").mkdir(parents=True)
        expected = "holds no runs"
    elif case == "truncated":
        shutil.copytree(RESULTS / "cov_rate" / "paper", root / "cov_rate" / "paper",
                        ignore=shutil.ignore_patterns("figures"))
        table = root / "cov_rate" / "paper" / "metrics.csv"
        table.write_bytes(table.read_bytes()[:2000] + b'\n1,2,"unclosed')
        expected = "cannot be read"
    else:  # a run from before the columns its figures read
        _run(root / "cov_rate" / "old", metrics="experiment,run_id,metric,value\ncov_rate,x,slope,1.0\n")
        expected = "written by commit abc1234"
    proc = run_cli("plot", str(root), "--docs", str(docs))
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert [p.name for p in (docs / "figures").iterdir()] == ["kept.png"]
    assert not (root / MANIFEST).exists()


def test_plot_of_an_experiment_without_figures_says_so(tmp_path):
    run = _run(tmp_path / "export", experiment="patch_export")
    proc = run_cli("plot", str(run))
    assert proc.returncode != 0 and "patch_export draws no figures" in proc.stderr, proc.stderr


def test_every_quoted_number_is_what_results_holds():
    """README.md and docs/*.md quote numbers between markers; each is what the committed run says now, so a
    rerun cannot leave two pages disagreeing (redraw: `icl-exp plot results/`)."""
    from experiments.core.report.quoted import MARK, fill, pages

    quoted = 0
    for page in pages(REPO_ROOT):
        text = page.read_text()
        quoted += len(MARK.findall(text))
        assert fill(text, RESULTS) == text, f"{page.name} quotes a number results/ no longer holds"
    assert quoted > 50


def test_the_papers_page_is_what_results_and_the_items_make():
    from experiments.core.docs_build import PAPER_ITEMS, PAPERS_PAGE
    from experiments.core.report.papers_page import papers_page
    from experiments.core.report.quoted import fill

    units = find_units(RESULTS)
    docs = REPO_ROOT / "docs"
    figures = {p.name for p in DOC_FIGURES.glob("*.png")}
    expected = fill(papers_page(docs / PAPER_ITEMS, RESULTS, units, figures), RESULTS)
    assert (docs / PAPERS_PAGE).read_text() == expected, "docs/papers.md is stale: `icl-exp plot results/`"


def test_a_committed_runs_gzipped_samples_are_shown():
    """`icl-exp show` reads a committed run's samples.jsonl.gz as it reads a user's samples.jsonl."""
    zipped = sorted(RESULTS.glob("*/*/*/samples.jsonl.gz")) + sorted(RESULTS.glob("*/*/samples.jsonl.gz"))
    assert zipped, "no committed run keeps gzipped samples"
    proc = run_cli("show", str(zipped[0].parent))
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
