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
    """Draw every run under `root`; with `docs`, fill docs/figures, docs/papers.md and the quoted numbers of
    README.md and docs/*.md; write the manifest. Every page is worked out before any file is written."""
    from experiments.core.atomic import write_text_atomic

    root = Path(root)
    units = find_units(root)
    if not units:
        raise UserError(f"{root} holds no runs: no results/<experiment>/<run>/ folder with run.json and metrics.csv")
    drawn = draw_units(units)
    if docs is None:
        return [*sorted(drawn.values()), write_manifest(root, units)]
    from experiments.core.report.papers_page import papers_page
    from experiments.core.report.quoted import refreshed

    docs, pages = Path(docs).resolve(), {}
    figures = docs / "figures"
    if (docs / PAPER_ITEMS).is_file():
        # the thumbnails it links are the ones this redraw writes
        pages[docs / PAPERS_PAGE] = papers_page(docs / PAPER_ITEMS, root, units, set(drawn))
    pages = refreshed(docs.resolve().parent, root, pages)
    written = copy_figures(drawn, figures)
    for page, text in pages.items():
        write_text_atomic(page, text)
    return [*written, *pages, write_manifest(root, units)]
