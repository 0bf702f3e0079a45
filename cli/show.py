"""`icl-exp show RUN_DIR`: a run's samples.jsonl (experiments/core/samples.py) in the terminal, per prompt
the tokens of the model with the context, the patched model and the control side by side, each position a
row, a patched token that differs from the context's top-1 highlighted."""

from __future__ import annotations

from pathlib import Path

import typer

# the index keys that tell a run's groups of samples apart, besides the prompt (layer_errors: per dtype, variant)
GROUP_KEYS = ("model", "dtype", "variant", "system", "method", "split")


def _visible(text: str) -> str:
    """A token as it reads: a newline or a tab as a sign, a blank or unprintable token as its repr (`' '`,
    `'\\x16'`), rich markup escaped."""
    from rich.markup import escape

    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    return escape(shown) if shown.strip() and shown.isprintable() else escape(repr(text))


def _group(sample: dict) -> tuple:
    """Token samples: a table per prompt; reply samples (whole replies): a table per system prompt and method."""
    own = tuple((k, sample[k]) for k in GROUP_KEYS if k in sample)
    return own if sample.get("level") == "reply" else own + (("prompt", sample.get("prompt")),)


def _reply_table(title: str, rows: list[dict], mismatches_only: bool):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=True)
    for column in ("query", "with context", "patched", "control"):
        table.add_column(column, overflow="fold")
    for r in rows:
        if mismatches_only and r.get("top1_agree"):
            continue
        patched = escape(r["patched"]["text"])
        ctrl = r.get("control")
        table.add_row(escape(str(r.get("prompt", r.get("query")))), escape(r["context"]["text"]),
                      patched if r.get("top1_agree") else f"[bold red]{patched}[/]",
                      "" if ctrl is None else escape(ctrl["text"]) if r.get("control_top1_agree")
                      else f"[dim]{escape(ctrl['text'])}[/]")
    return table


def tables(samples: list[dict], mismatches_only: bool = False) -> list:
    """One rich Table per prompt (and dtype, variant, ...): position, generated token, context / patched /
    control top-1, agreement and the logit distances."""
    from rich.table import Table

    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault(_group(s), []).append(s)
    out = []
    for key, rows in groups.items():
        agree = sum(bool(r.get("top1_agree")) for r in rows)
        controls = [r for r in rows if r.get("control") is not None]
        control = f", control {sum(bool(r.get('control_top1_agree')) for r in controls)}/{len(controls)}" \
            if controls else ""
        what = "reply is the with-context one" if rows[0].get("level") == "reply" else "top-1 agrees"
        title = " ".join(f"{k}={v}" for k, v in key) + f": patched {what} {agree}/{len(rows)}{control}"
        if rows[0].get("level") == "reply":
            out.append(_reply_table(title, rows, mismatches_only))
            continue
        table = Table(title=title, title_justify="left", show_lines=False)
        for column in ("pos", "with context", "patched", "control", "L∞ patched", "tvd patched", "L∞ control"):
            table.add_column(column, justify="right" if column.startswith(("pos", "L∞", "tvd")) else "left")
        for r in rows:
            if mismatches_only and r.get("top1_agree"):
                continue
            patched = _visible(r["patched"]["text"])
            patched = patched if r.get("top1_agree") else f"[bold red]{patched}[/]"
            ctrl = r.get("control")
            ctrl_text = "" if ctrl is None else _visible(ctrl["text"])
            if ctrl is not None and not r.get("control_top1_agree"):
                ctrl_text = f"[dim]{ctrl_text}[/]"
            table.add_row(str(r.get("position", r["step"])), _visible(r["context"]["text"]), patched, ctrl_text,
                          f"{r['logit_linf']:.3g}", f"{r['tvd']:.3g}",
                          "" if ctrl is None else f"{r['control_logit_linf']:.3g}")
        out.append(table)
    return out


def show(
    run_dir: Path = typer.Argument(..., help="a run folder that generated text (patch_match, gemma_match, "
                                   "layer_errors, system_compile)"),
    mismatches: bool = typer.Option(False, "--mismatches", help="only the positions where the patched model's "
                                    "top-1 differs from the model with the context"),
) -> None:
    """Print a run's samples.jsonl: per prompt the tokens with the context, patched and the control, side by
    side; a patched token that differs from the with-context one in bold red, a control that differs dim."""
    from rich.console import Console

    from cli.output import fail
    from experiments.core.samples import SAMPLES_FILE, read_samples, samples_path

    path = samples_path(run_dir)
    if not run_dir.is_dir():
        fail(f"{run_dir}: no such folder (give a run folder, e.g. results/patch_match/STAMP)")
    if not path.is_file():
        jobs = sorted(p.parent.name for p in run_dir.glob(f"*/{SAMPLES_FILE}"))
        hint = f"a sweep: show one job, e.g. icl-exp show {run_dir / jobs[0]}" if jobs else \
            "only runs that generate text write one: patch_match, gemma_match, layer_errors, system_compile"
        fail(f"{run_dir} has no {SAMPLES_FILE} ({hint})")
    try:
        samples = read_samples(path)
    except ValueError as err:
        fail(f"{path} is not JSON lines ({err})")
    console = Console()
    for table in tables(samples, mismatches):
        title, table.title = table.title, None  # the heading whole on its line, not wrapped to the table's width
        console.print(title, soft_wrap=True, highlight=False, markup=False)
        console.print(table)
