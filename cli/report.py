"""`icl-exp report [RESULTS_DIR]`: one report of every claim, grouped by paper (experiments/core/report/)."""

from __future__ import annotations

from pathlib import Path

import typer


def report(
    results_dir: Path = typer.Argument(Path("results"), help="folder to walk for run folders (default: results)"),
    all_runs: bool = typer.Option(False, "--all", help="every run, not only the newest complete one at the highest "
                                  "preset (paper > gpu > cpu > smoke) per experiment"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 if any reported claim fails (a preset=smoke run's "
                                "failures are expected and do not count)"),
    out: Path = typer.Option(None, "--out", help="where report.md and report.html go (default: RESULTS_DIR)"),
    results_md: Path = typer.Option(None, "--results-md", help="also write the results page (e.g. docs/results.md): "
                                    "per paper the runs and the claims, a sweep one row per model; the whole file "
                                    "is generated (the figures the docs show: `icl-exp plot results/`)"),
) -> None:
    """Write RESULTS_DIR/report.md and a self-contained report.html: every claim (paper value, measured,
    tolerance, pass/fail, run, preset), figures, failed or missing experiments, a summary per paper."""
    from rich.console import Console

    from cli.output import fail
    from experiments.core.figures import no_such_folder
    from experiments.core.report.collect import build_report
    from experiments.core.report.results_page import check_page_path, write_results_page
    from experiments.core.report.text import paper_groups, runs_line, summary_line
    from experiments.core.report.write import write_report

    if not results_dir.exists():
        fail(str(no_such_folder(results_dir, "give the folder your runs are in; default: results")))
    if not results_dir.is_dir():
        fail(f"{results_dir} is not a folder; give the folder your runs are in (default: results)")
    if results_md is not None:
        try:
            check_page_path(results_md)
        except ValueError as error:
            fail(f"--results-md {results_md}: {error}")
    rep = build_report(results_dir, all_runs=all_runs)
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    for problem in rep.problems:
        err.print(f"[yellow]warning:[/] {problem}")
    md, page = write_report(rep, out or results_dir)
    con = Console(soft_wrap=True, highlight=False)
    for _, title, rows in paper_groups(rep):
        if len(rows):
            con.print(f"{title}: {summary_line(rows)}")
    for name, why in rep.reasons.items():
        if "passed over" in why:  # say it where a newer run was not the one shown
            con.print(f"{name}: {why}")
    for r in rep.failed:
        con.print(f"not complete: {r.experiment} ({r.path}): {r.status}")
    con.print(f"{summary_line(rep.shown)} {runs_line(rep)}")
    if rep.missing:
        con.print(f"never run: {', '.join(rep.missing)}")
    con.print(f"report: {md}\nreport: {page}")
    if results_md is not None:
        command = f"icl-exp report {results_dir}{' --all' if all_runs else ''} --results-md {results_md}"
        try:
            write_results_page(results_md, rep, command)
        except (OSError, ValueError) as error:
            fail(f"cannot write the results page {results_md}: {getattr(error, 'strerror', None) or error}")
        con.print(f"results page: {results_md}")
    if strict and rep.n_failed_claims:
        con.print(f"--strict: {rep.n_failed_claims} claim(s) failed")
        raise typer.Exit(1)
