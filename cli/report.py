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
    readme: Path = typer.Option(None, "--readme", help="also rewrite the results tables between the "
                                "<!-- results:begin --> and <!-- results:end --> markers of this file"),
) -> None:
    """Write RESULTS_DIR/report.md and a self-contained report.html: every claim (paper value, measured,
    tolerance, pass/fail, run, preset), figures, failed or missing experiments, a summary per paper."""
    from rich.console import Console

    from cli.output import fail
    from experiments.core.figures import no_such_folder
    from experiments.core.report.collect import build_report
    from experiments.core.report.readme import update_readme
    from experiments.core.report.text import paper_groups, runs_line, summary_line
    from experiments.core.report.write import write_report

    if not results_dir.exists():
        fail(str(no_such_folder(results_dir, "give the folder your runs are in; default: results")))
    if not results_dir.is_dir():
        fail(f"{results_dir} is not a folder; give the folder your runs are in (default: results)")
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
    if readme is not None:
        try:
            update_readme(readme, rep)
        except (OSError, ValueError) as error:
            fail(str(error))
        con.print(f"README tables rewritten: {readme}")
    if strict and rep.n_failed_claims:
        con.print(f"--strict: {rep.n_failed_claims} claim(s) failed")
        raise typer.Exit(1)
