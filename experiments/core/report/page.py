"""report.html: the report as one self-contained page, rendered from templates/report.html.j2.

Python decides what the page says (the same words as report.md, from text.py); the template decides
how it looks, and Jinja2's autoescaping keeps a claim id or an error message from breaking the markup.
Figures are embedded as downscaled base64 PNGs, so the file can be mailed or copied off a cluster alone.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from experiments.core.report import text
from experiments.core.report.collect import Report
from experiments.core.report.runs import rel

TEMPLATE = "report.html.j2"
THUMB_WIDTH = 640  # px: the embedded figures are downscaled to this width


def thumbnail(png: Path) -> str | None:
    """The PNG downscaled to THUMB_WIDTH, as a data: URI (None if the file is unreadable)."""
    try:
        from PIL import Image

        with Image.open(png) as im:
            im = im.convert("RGB")
            if im.width > THUMB_WIDTH:
                im = im.resize((THUMB_WIDTH, round(im.height * THUMB_WIDTH / im.width)), Image.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, format="PNG", optimize=True)
    except Exception:
        return None
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _claim_row(row) -> dict:
    cells = text.claim_cells(row)
    return dict(cls="pass" if row["passed"] else "expected" if row["expected"] else "fail",  # smoke's: not red
                id=row["id"], description=str(row["description"]), ref=str(row["ref"]), numbers=cells[2:5],
                result=text.result_text(row, bold=""), run=cells[6], preset=cells[7], model=cells[8])


def _section(report: Report, package: str, title: str, rows) -> dict:
    """One paper's part of the page, as plain data for the template."""
    failed, missing = text.not_run(report, package)
    figures = [(exp, png, thumbnail(png)) for exp, png in text.figure_files(report, package)]
    return dict(
        package=package, heading=f"{title} — {text.summary_line(rows)}",
        experiments=[dict(name=name, figures=text.figures_of(name), why=report.reasons.get(name),
                          rows=[_claim_row(r) for _, r in text.split_construction(group)[0].iterrows()],
                          built=[_claim_row(r) for _, r in text.split_construction(group)[1].iterrows()])
                     for name, group in rows.groupby("experiment", sort=True)],
        construction_note=text.CONSTRUCTION_NOTE,
        failed=[dict(experiment=r.experiment, path=rel(r.path, report.root), state=text.run_state(r)) for r in failed],
        missing=missing,
        figures=[dict(experiment=exp, name=png.name, uri=uri) for exp, png, uri in figures if uri])


def render_html(report: Report) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(loader=PackageLoader("experiments.core.report", "templates"),
                      autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    sections = [_section(report, package, title, rows) for package, title, rows in text.paper_groups(report)
                if text.has_content(report, package, rows)]
    return env.get_template(TEMPLATE).render(
        root=str(report.root), summary=f"{text.summary_line(report.shown)} {text.runs_line(report)}",
        problems=report.problems, header=text.CLAIM_HEADER, sections=sections)
