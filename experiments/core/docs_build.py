"""`icl-exp plot results/`: everything the docs show, drawn again from the committed runs alone.

Every run's figures from its tables (into its own figures/, as `icl-exp plot RUN` does), the PNGs copied
into docs/figures with the table each was drawn from in its metadata, results/README.md (the manifest),
docs/papers.md (the papers beside the tool) and every number README.md and docs/*.md quote between
report/quoted.py's markers. Nothing is copied until every run has drawn: a run that cannot
be drawn stops it in one line and leaves docs/ as it was.
"""

from __future__ import annotations

from pathlib import Path

from experiments.core.errors import UserError
from experiments.core.results_root import copy_figures, draw_units, find_units, write_manifest

PAPER_ITEMS = "paper_items.yaml"  # docs/paper_items.yaml: the papers' own numbers, kept by hand
PAPERS_PAGE = "papers.md"


def rebuild(root: Path, docs: Path | None) -> list[Path]:
    """Draw every run under `root`; with `docs`, fill docs/figures and docs/papers.md; write the manifest."""
    root = Path(root)
    units = find_units(root)
    if not units:
        raise UserError(f"{root} holds no runs: no results/<experiment>/<run>/ folder with run.json and metrics.csv")
    drawn = draw_units(units)
    written = []
    if docs is not None:
        written += copy_figures(drawn, Path(docs) / "figures")
        items = Path(docs) / PAPER_ITEMS
        if items.is_file():
            from experiments.core.report.papers_page import write_papers_page

            written.append(write_papers_page(Path(docs) / PAPERS_PAGE, items, root, units, Path(docs) / "figures"))
        from experiments.core.report.quoted import refresh

        written += refresh(Path(docs).resolve().parent, root)  # the numbers README and docs/*.md quote
    else:
        written += sorted(drawn.values())
    written.append(write_manifest(root, units))
    return written
