"""report.md: per paper, the runs the numbers come from, a table of claims per experiment, what did not
run, and links to the figures. Plain Markdown, so it reads in a terminal and renders on GitHub."""

from __future__ import annotations

from experiments.core.report.collect import Report
from experiments.core.report.runs import rel, run_rows
from experiments.core.report.text import (
    CLAIM_HEADER,
    CONSTRUCTION_NOTE,
    claim_cells,
    figure_files,
    figures_of,
    has_content,
    not_run,
    paper_groups,
    run_state,
    runs_line,
    runs_of,
    split_construction,
    summary_line,
)


def md_cell(text: str) -> str:
    """A table cell that cannot break the table: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def runs_table(report: Report, package: str) -> list[str]:
    """Markdown rows: which runs each paper's numbers come from (model, preset, device, dtype, wall time, claims);
    a sweep is one row per model it ran, with the other values it swept and its number of jobs (runs.run_rows)."""
    runs = runs_of(report, package)
    if not runs:
        return []
    lines = ["| Experiment | Run | Model | Swept | Jobs | Preset | Device | Wall | Claims |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in run_rows(runs):
        wall = row.wall_s
        swept = "; ".join(f"{key}: {', '.join(values)}" for key, values in row.swept.items())
        cells = (row.experiment, rel(row.where, report.root), row.model, swept, len(row.jobs), row.preset,
                 row.devices, "" if wall is None else f"{wall:.0f} s", row.claims)
        lines.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return lines + [""]


def render_markdown(report: Report) -> str:
    total = report.shown
    lines = [f"# icl-exp report: {report.root}", "", f"{summary_line(total)} {runs_line(report)}", ""]
    if report.problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in report.problems] + [""]
    for package, title, rows in paper_groups(report):
        if not has_content(report, package, rows):
            continue
        failed, missing = not_run(report, package)
        lines += [f"## {title} — {summary_line(rows)}", "", *runs_table(report, package)]
        for name, group in rows.groupby("experiment", sort=True):
            lines += [f"### {name} ({figures_of(name)})", ""]
            if name in report.reasons:
                lines += [f"Shown: {report.reasons[name]}.", ""]
            evidence, built = split_construction(group)
            for part, lead in ((evidence, []), (built, [CONSTRUCTION_NOTE, ""])):
                if part.empty:
                    continue
                lines += [*lead, "| " + " | ".join(CLAIM_HEADER) + " |", "|" + "---|" * len(CLAIM_HEADER)]
                lines += ["| " + " | ".join(md_cell(c) for c in claim_cells(r)) + " |" for _, r in part.iterrows()]
                lines += ["", *[f"- `{r['id']}`: {r['description']}" for _, r in part.iterrows()], ""]
        for r in failed:
            lines.append(f"- **not complete**: {r.experiment} — {rel(r.path, report.root)}: {run_state(r)}")
        for name in missing:
            lines.append(f"- **missing**: {name} has no run under {report.root}")
        figures = figure_files(report, package)
        if figures:
            lines += ["", "Figures:", ""]
            lines += [f"- {exp}: [{png.name}]({rel(png, report.root)})" for exp, png in figures]
        lines.append("")
    return "\n".join(lines)
