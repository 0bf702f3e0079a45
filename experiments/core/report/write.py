"""report.md and report.html written side by side, each atomically, so that a reader never opens half a
report (a crash mid-write leaves the previous one)."""

from __future__ import annotations

from pathlib import Path

from experiments.core.atomic import write_atomic
from experiments.core.report.collect import Report
from experiments.core.report.markdown import render_markdown
from experiments.core.report.page import render_html

REPORT_MD, REPORT_HTML = "report.md", "report.html"


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / REPORT_MD, out_dir / REPORT_HTML
    markdown, html_text = render_markdown(report), render_html(report)
    write_atomic(md, lambda p: Path(p).write_text(markdown))
    write_atomic(page, lambda p: Path(p).write_text(html_text))
    return md, page
