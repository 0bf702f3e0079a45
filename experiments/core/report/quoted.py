"""Numbers a page quotes from results/, written between markers so that a redraw rewrites them: a rerun
cannot leave two pages disagreeing, and a test finds a number typed in by hand that no longer matches.

    <!-- q: patch_match/qwen2.5-0.5b goldwaser.fig3.naive_float32_top1_match .3g -->100<!-- /q -->

reads, from the committed run (or sweep) `results/patch_match/qwen2.5-0.5b`, the claim's measured value
(a sweep: the job that has it; more than one: their range), formatted by the spec (default `.3g`). Besides a
claim id, WHAT may be
    claims        `passed/total` over the unit's claims
    wall          its wall time (`22 s`, `4 min 10 s`)
    metric:NAME:AGG   an aggregate of metrics.csv rows of that metric (AGG: max, min, mean, median, count, sum;
                      `metric:top1_match:mean:dtype=float32` filters on index columns), e.g. a top-1 rate

A whole table a page shows is written the same way, between

    <!-- table: MODULE:FUNCTION UNIT [UNIT ...] -->
    ...
    <!-- /table -->

which FUNCTION (imported when the page is filled) writes from the listed runs or sweeps of results/:
FUNCTION(list of their folders) -> Markdown. An experiment's own module makes the table; this module only
knows where it goes.
"""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path

import pandas as pd

from experiments.core.errors import UserError
from experiments.core.results import read_metrics
from experiments.core.run_folder import CLAIMS_FILE

TABLE = re.compile(r"(?P<head><!-- table: (?P<target>\S+:\S+)(?P<units>(?: [^ >]+)+) -->\n)(?P<body>.*?)"
                   r"(?P<tail><!-- /table -->)", re.S)
MARK = re.compile(r"<!-- q: (?P<unit>\S+) (?P<what>\S+)(?: (?P<spec>\S+))? -->(?P<text>.*?)<!-- /q -->", re.S)


def _runs(unit: Path) -> list[Path]:
    from experiments.core.figures import is_run_dir, job_dirs

    return [unit] if is_run_dir(unit) else job_dirs(unit)


def _number(value: float, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    if spec.endswith("%"):
        return format(value, spec)
    text = format(value, spec)
    return text.replace("e-0", "e-").replace("e+0", "e")


def _table(path: Path, read, tables: dict | None) -> pd.DataFrame:
    """read(path), once per fill: a page quotes the same run's tables dozens of times."""
    if tables is None:
        return read(path)
    if path not in tables:
        tables[path] = read(path)
    return tables[path]


def _claim_values(runs: list[Path], claim: str, tables: dict | None) -> list[float]:
    values = []
    for run in runs:
        if (run / CLAIMS_FILE).is_file():
            frame = _table(run / CLAIMS_FILE, pd.read_csv, tables)
            hit = frame[[fnmatch.fnmatchcase(str(i), claim) for i in frame["id"]]]
            values += [float(v) for v in hit["measured"]]
    return values


def quote(results: Path, unit: str, what: str, spec: str | None = None, tables: dict | None = None) -> str:
    """The text a marker stands for: a UserError naming the marker when results/ cannot give it. `tables`: the
    tables read so far (fill shares one across its markers)."""
    from experiments.core.results_root import _wall

    folder = Path(results) / unit
    runs = _runs(folder) if folder.is_dir() else []
    if not runs:
        raise UserError(f"quoted number {unit} {what}: results/{unit} is no committed run")
    spec = spec or ".3g"
    if what == "claims":
        frames = [_table(r / CLAIMS_FILE, pd.read_csv, tables) for r in runs if (r / CLAIMS_FILE).is_file()]
        passed = sum(int(f["passed"].astype(str).str.lower().eq("true").sum()) for f in frames)
        return f"{passed}/{sum(len(f) for f in frames)}"
    if what == "wall":
        import json

        return _wall(sum(float(json.loads((r / "run.json").read_text()).get("wall_time_s") or 0) for r in runs))
    if what.startswith("metric:"):
        _, name, agg, *filters = what.split(":")
        frame = pd.concat([_table(r, read_metrics, tables) for r in runs], ignore_index=True)
        rows = frame[frame["metric"] == name]
        for f in filters:
            key, value = f.split("=", 1)
            rows = rows[rows[key].astype(str) == value]
        if rows.empty:
            raise UserError(f"quoted number {unit} {what}: no such rows in its metrics")
        return _number(float(getattr(rows["value"].astype(float), agg)()), spec)
    values = _claim_values(runs, what, tables)
    if not values:
        raise UserError(f"quoted number {unit} {what}: no such claim in its claims.csv")
    lo, hi = _number(min(values), spec), _number(max(values), spec)
    return lo if lo == hi else f"{lo}–{hi}"


def _written_table(results: Path, target: str, units: str) -> str:
    from experiments.core.registry import Later

    folders = [results / unit for unit in units.split()]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        raise UserError(f"table {target}: no run or sweep {', '.join(missing)} in results/")
    return Later(target)(folders).rstrip("\n") + "\n"


def fill(text: str, results: Path, tables: dict | None = None) -> str:
    """`text` with every marker's number, and every generated table, read again from results/ (each CSV read
    once: `tables`)."""
    tables = {} if tables is None else tables
    text = TABLE.sub(lambda m: m["head"] + _written_table(results, m["target"], m["units"]) + m["tail"], text)
    return MARK.sub(lambda m: m.group(0).replace(
        f"-->{m.group('text')}<!--", f"-->{quote(results, m['unit'], m['what'], m['spec'], tables)}<!--", 1), text)


def pages(repo: Path) -> list[Path]:
    """The pages that may quote: README.md and docs/*.md."""
    return [p for p in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))] if p.is_file()]


def refreshed(repo: Path, results: Path, extra: dict[Path, str] | None = None) -> dict[Path, str]:
    """{page: its text with every quoted number read again}, for the pages whose text changes; `extra` holds pages
    about to be written (docs/papers.md), quoted from their new text. Nothing is written: a marker results/
    cannot answer stops it first."""
    texts = {page: page.read_text() for page in pages(repo)}
    texts.update(extra or {})
    out, tables = {}, {}
    for page, text in texts.items():
        new = fill(text, results, tables) if MARK.search(text) or TABLE.search(text) else text
        if new != (page.read_text() if page.is_file() else None):
            out[page] = new
    return out
