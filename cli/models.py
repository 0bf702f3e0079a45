"""`icl-exp models [TYPE]...`: which causal-LM families of the installed transformers can be patched, and how
(experiments/patching/arch/survey.py: by an adapter file, by their module tree, or refused and why)."""

from __future__ import annotations

import typer


def models(
    model_types: list[str] = typer.Argument(None, help="model_type values to ask about (default: every causal-LM "
                                            "family transformers knows)", show_default=False),
    refresh: bool = typer.Option(False, "--refresh", help="recompute instead of reading the cache"),
    out_dir: str = typer.Option(None, "--out", metavar="DIR", help="also write the table into DIR/survey.csv with its "
                            "record, DIR/survey.json (how results/models is kept: `--refresh --out results/models`)",
                            show_default=False),
) -> None:
    """Every causal-LM family the installed transformers knows, one line each: whether context patching takes
    it (by an adapter file, by its module tree, confirmed on a tiny random model in float64) or refuses it, and
    why. Computed on demand (seconds per family, minutes for all), cached per transformers version."""
    from cli.output import fail
    from experiments.core.console import plain_console
    from experiments.patching.arch.survey import causal_lm_types, survey

    known = causal_lm_types()
    unknown = [t for t in model_types or () if t not in known]
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0], known, n=1)
        fail(f"model_type {unknown[0]!r} has no causal-LM class in the installed transformers"
             + (f"; did you mean {near[0]!r}?" if near else "; `icl-exp models` lists them"))
    import time

    status = plain_console(stderr=True)
    computed = []

    def progress(t: str) -> None:
        computed.append(t)
        status.print(f"checking {t} ...", highlight=False)

    start = time.perf_counter()
    rows = survey(list(model_types) if model_types else None, refresh=refresh, progress=progress)
    wall_s = time.perf_counter() - start
    out = plain_console()
    width = max(len(r.model_type) for r in rows)
    for r in rows:
        out.print(f"{r.model_type:<{width}}  {r.status:<12}  {r.detail}", highlight=False, markup=False)
    counts = {s: sum(r.status == s for r in rows) for s in dict.fromkeys(r.status for r in rows)}
    out.print("; ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
    if out_dir:
        from experiments.patching.survey_record import write

        for path in write(out_dir, rows, wall_s=wall_s, computed=len(computed), complete=not model_types):
            status.print(f"wrote {path}", highlight=False)
