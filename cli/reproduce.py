"""`icl-exp reproduce [preset=cpu] [--only a,b] [OVERRIDES]`: every registered experiment, then the report.

Runs each experiment in its own `icl-exp run` subprocess (a crash, an out-of-memory kill or a bad
config in one never stops the others), in dependency order: linreg_icl first, and its run folder is
the `checkpoint=` of the experiments that study linreg_icl's trained block, so that model is trained
once. Every run goes to RESULTS/<name>/ and its console output to RESULTS/logs/<name>.log; the report
(report.md, report.html) is written over RESULTS at the end.

Overrides: `key=value` goes to every experiment, `NAME:key=value` to NAME only
(e.g. `linreg_icl:train.steps=2000`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import typer


def needs(name: str) -> tuple[str, ...]:
    """The experiments whose run folder `name` takes as checkpoint= (`Experiment.needs`)."""
    from experiments.core import registry

    return registry.get(name).needs


def run_args(name: str, folder: Path) -> list[str]:
    """`icl-exp run NAME`'s first words: one run into `folder`, or the experiment's reproduce sweep
    (`Experiment.reproduce_sweep`) with its jobs under `folder`."""
    from experiments.core import registry

    sweep = registry.get(name).reproduce_sweep
    return ["-m", f"hydra.sweep.dir={folder}", *sweep] if sweep else [f"hydra.run.dir={folder}"]


def ordered(names: list[str]) -> list[str]:
    """The experiments others need first, then those that need them (by name), then the rest as given."""
    providers = [n for n in names if any(n in needs(m) for m in names)]
    dependents = sorted(n for n in names if needs(n) and n not in providers)
    return providers + dependents + [n for n in names if n not in providers and n not in dependents]


def split_overrides(args: list[str], names: list[str]) -> tuple[str, list[str], dict[str, list[str]]]:
    """(preset, overrides for all, overrides per experiment) from the command line's extra words."""
    preset, common, per = "cpu", [], {n: [] for n in names}
    for arg in args:
        head, sep, rest = arg.partition(":")
        if sep and "=" in rest and "=" not in head and head in per:
            per[head].append(rest)
        elif arg.startswith("preset="):
            preset = arg.split("=", 1)[1]
        else:
            common.append(arg)
    return preset, common, per


def reproduce(
    ctx: typer.Context,
    only: str = typer.Option(None, "--only", help="comma-separated experiment names (default: every registered one)"),
    results: Path = typer.Option(None, "--results", help="where the runs go (default: results/reproduce/<time>)"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 also if a claim fails"),
) -> None:
    """Run every registered experiment at a preset (preset=cpu unless given) in dependency order, each in its
    own process, with one progress display, then write the report. A failed experiment is reported and does
    not stop the others; the exit status is 1 if any failed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cli.output import fail, unique_stamp
    from experiments.core import registry
    from experiments.core.report.collect import build_report
    from experiments.core.report.text import paper_groups, summary_line
    from experiments.core.report.write import write_report

    known = [e.name for e in registry.all_experiments()]
    names = known
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            fail(f"--only: unknown experiment(s) {', '.join(unknown)}; known: {', '.join(known)}")
    names = ordered(names)
    preset, common, per = split_overrides(list(ctx.args), names)
    root = results or Path("results") / "reproduce" / unique_stamp()
    try:
        (root / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"cannot write the results folder {root}: {err.strerror or err}")
    out = Console(soft_wrap=True, highlight=False)
    out.print(f"reproduce: {len(names)} experiment(s) at preset={preset} -> {root}")

    status: dict[str, str] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    interrupted = False
    with Progress(*columns, console=out, transient=True, disable=not out.is_terminal) as bar:
        overall = bar.add_task("reproduce", total=len(names))
        for name in names:
            if interrupted:
                break
            bar.update(overall, description=f"reproduce: {name}")
            args = [f"preset={preset}", *run_args(name, root / name), *common, *per[name]]
            for provider in needs(name):
                if status.get(provider) == "complete":
                    args.append(f"checkpoint={(root / provider).resolve()}")
            t0 = time.perf_counter()
            log_file = root / "logs" / f"{name}.log"
            with open(log_file, "w") as log:
                try:  # Ctrl-C reaches the child too (same process group): it marks its run interrupted
                    proc = subprocess.run([sys.executable, "-m", "cli.main", "run", name, *args], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                except KeyboardInterrupt:
                    interrupted = True
                    out.print(f"[yellow]interrupted[/] during {name}: the report covers what finished")
                    break
            wall = time.perf_counter() - t0
            status[name] = "complete" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
            if proc.returncode == 0:
                out.print(f"[green]ok[/]     {name:<18} {wall:7.1f} s")
            else:
                out.print(f"[red]FAILED[/] {name:<18} {wall:7.1f} s  exit {proc.returncode}: "
                          f"{_last_line(log_file)}  (log: {log_file})")
            bar.advance(overall)

    report = build_report(root)
    md, page = write_report(report, root)
    for _, title, rows in paper_groups(report):
        if len(rows):
            out.print(f"{title}: {summary_line(rows)}")
    failed = [n for n, s in status.items() if s != "complete"]
    out.print(f"{len(names) - len(failed)}/{len(names)} experiments complete"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
    out.print(f"report: {md}\nreport: {page}")
    if interrupted:
        raise typer.Exit(130)
    if failed or (strict and report.n_failed_claims):
        raise typer.Exit(1)


reproduce.context_settings = {"allow_extra_args": True, "ignore_unknown_options": True}


def _last_line(log_file: Path) -> str:
    """The error line a failed run ended with (the last non-empty line of its output)."""
    lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
