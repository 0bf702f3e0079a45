"""`icl-exp report`: every claim of every paper in one place, from the run folders alone.

Walks a results folder for run folders (run.json), keeps per experiment the newest complete run at
the highest preset (paper > gpu > cpu > smoke; a multirun sweep counts as one run: all its complete
jobs), or every run with `all_runs`, and collects their claims.csv rows; why each run was taken is
said beside it. A sweep's claim is shown once, with the range of its jobs' values. A claim that fails
in a preset=smoke run is marked as expected there (smoke checks the code, not the science) and is not
counted by `--strict`. Bad input never stops the report: an unreadable run.json, a
corrupt or truncated claims.csv, or claims from an older version without ids each become one line
under "Problems", and the rest is written. Papers come in registry.PAPER_PACKAGES order.

Outputs: report.md (tables, figures linked), report.html (self-contained: figures embedded as
base64 PNG thumbnails) and, for the README, `readme_tables` / `update_readme`, which rewrite the
text between README_BEGIN and README_END from the same rows.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from experiments.core import registry
from experiments.core.results import CHECK_COLUMNS, CLAIM_COLUMNS, CLAIMS_FILE, FIGURES_DIR, RUN_FILE

REPORT_MD, REPORT_HTML = "report.md", "report.html"
README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"
OTHER = "other"  # the paper group of runs whose experiment is no longer registered
THUMB_WIDTH = 640  # px: the embedded figures are downscaled to this width
# Which run of an experiment speaks for it: the highest preset first, then the newest. A preset not named
# here (a user's own) ranks with cpu.
PRESET_RANK = {"smoke": 0, "cpu": 1, "gpu": 2, "paper": 3}
SMOKE = "smoke"
NOT_COMPLETE = ("interrupted", "running", "failed", "unknown")  # the order the summary counts them in
CLAIMS_SHOWN = ["paper", "experiment", *CLAIM_COLUMNS, "run", "preset", "job", "unit"]
CLAIM_TABLE = CLAIMS_SHOWN


@dataclass
class Run:
    """One run folder (a single run, or one job of a sweep)."""

    path: Path
    experiment: str
    status: str  # complete / failed / interrupted / running / unknown
    start: str
    preset: str
    record: dict
    sweep: Path | None = None  # the multirun folder this job belongs to

    @property
    def unit(self) -> Path:
        """What "newest run" picks among: a sweep as a whole, or the run itself."""
        return self.sweep or self.path


@dataclass
class Report:
    root: Path
    claims: pd.DataFrame  # CHECK_COLUMNS + measure, paper, experiment, run, preset, job, unit: one row per job
    runs: list[Run]  # the runs whose claims are shown
    failed: list[Run]  # runs not complete (the newest per experiment without a complete one, or all with --all)
    missing: list[str]  # registered experiments with no run at all
    problems: list[str] = field(default_factory=list)
    found: list[Run] = field(default_factory=list)  # every run folder under root, whatever its status
    reasons: dict[str, str] = field(default_factory=dict)  # experiment -> which run was taken, and why

    @property
    def shown(self) -> pd.DataFrame:
        """The claims as shown: one row per claim of each run, a sweep's jobs folded into one (see fold_jobs)."""
        return fold_jobs(self.claims)

    @property
    def n_failed_claims(self) -> int:
        """Failed claims that count (for --strict): not those of preset=smoke runs, which are expected."""
        rows = self.shown
        return int((~rows["passed"] & ~rows["expected"]).sum()) if len(rows) else 0

    @property
    def n_expected_failures(self) -> int:
        rows = self.shown
        return int(rows["expected"].sum()) if len(rows) else 0

    def not_complete_counts(self) -> dict[str, int]:
        """How many of all the runs found are not complete, by status (interrupted, running, failed, ...)."""
        counts: dict[str, int] = {}
        for r in self.found:
            if r.status != "complete":
                key = r.status if r.status in NOT_COMPLETE else "unknown"
                counts[key] = counts.get(key, 0) + 1
        return {k: counts[k] for k in NOT_COMPLETE if k in counts}


def fold_jobs(claims: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, run or sweep, claim id): a sweep's jobs folded, measured_min / measured_max
    over them, passed only if every job passed, `jobs` and `jobs_passed` counted; `expected` marks a
    failure of a preset=smoke run (expected there, not counted by --strict)."""
    columns = [*CLAIMS_SHOWN, "measured_min", "measured_max", "jobs", "jobs_passed", "expected"]
    if claims.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for _, group in claims.groupby(["experiment", "unit", "id"], sort=False):
        first = group.iloc[0].to_dict()
        passed = bool(group["passed"].all())
        first.update(measured_min=group["measured"].min(), measured_max=group["measured"].max(),
                     jobs=len(group), jobs_passed=int(group["passed"].sum()), passed=passed,
                     expected=not passed and first["preset"] == SMOKE,
                     job=",".join(j for j in group["job"] if j))
        rows.append(first)
    return pd.DataFrame(rows)[columns]


# -- reading the results ---------------------------------------------------------------------------


def find_runs(root: Path, problems: list[str]) -> list[Run]:
    """Every run folder under `root` (run.json next to it), with its sweep if its parent is a multirun."""
    runs = []
    for run_json in sorted(root.rglob(RUN_FILE)):
        if ".hydra" in run_json.parts:
            continue
        folder = run_json.parent
        try:
            record = json.loads(run_json.read_text())
            experiment = record["experiment"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            problems.append(f"{_rel(folder, root)}: run.json unreadable ({type(err).__name__}); run skipped")
            continue
        sweep = folder.parent if (folder.parent / "multirun.yaml").is_file() else None
        runs.append(Run(folder, experiment, str(record.get("status", "unknown")), str(record.get("start") or ""),
                        str(record.get("preset") or _preset_from_overrides(record)), record, sweep))
    return runs


def _preset_from_overrides(record: dict) -> str:
    for o in record.get("overrides") or []:
        if isinstance(o, str) and o.startswith("preset="):
            return o.split("=", 1)[1]
    return "paper"  # the default preset


def preset_rank(preset: str) -> int:
    return PRESET_RANK.get(preset, PRESET_RANK["cpu"])


def select_runs(runs: list[Run], all_runs: bool = False,
                reasons: dict[str, str] | None = None) -> tuple[list[Run], list[Run]]:
    """(complete runs to report, runs not complete to list as failed).

    Default: per experiment, among the units (runs or sweeps) with a complete run, the one at the highest
    preset (paper > gpu > cpu > smoke), the newest of those; its complete jobs are reported. A later smoke
    sweep does not displace a paper run. An experiment with no complete run lists its newest unit's runs as
    failed. `reasons` gets, per experiment, which run was taken and why."""
    if all_runs:
        return ([r for r in runs if r.status == "complete"], [r for r in runs if r.status != "complete"])
    chosen, failed = [], []
    for name in sorted({r.experiment for r in runs}):
        mine = [r for r in runs if r.experiment == name]
        units: dict[Path, list[Run]] = {}
        for r in mine:
            units.setdefault(r.unit, []).append(r)
        started = {u: max(r.start for r in rs) for u, rs in units.items()}
        complete = [u for u, rs in units.items() if any(r.status == "complete" for r in rs)]
        if complete:
            preset = {u: next(r.preset for r in units[u] if r.status == "complete") for u in complete}
            unit = max(complete, key=lambda u: (preset_rank(preset[u]), started[u]))
            chosen += [r for r in units[unit] if r.status == "complete"]
            failed += [r for r in units[unit] if r.status != "complete"]  # a sweep's failed jobs
            if reasons is not None:
                reasons[name] = _reason(unit, preset, started, complete, units)
        else:
            failed += units[max(units, key=started.__getitem__)]
    return chosen, failed


def _reason(unit: Path, preset: dict, started: dict, complete: list[Path], units: dict) -> str:
    """`preset=paper, started 2026-…: the highest preset with a complete run, the newest there; passed
    over: 1 newer smoke run` (what a reader needs to trust which numbers are shown)."""
    what = "sweep" if any(r.sweep for r in units[unit]) else "run"
    text = (f"{what} at preset={preset[unit]}, started {started[unit] or '?'}: the newest complete run at the "
            f"highest preset present (paper > gpu > cpu > smoke)")
    newer = [u for u in complete if u != unit and started[u] > started[unit]]
    if newer:
        by_preset: dict[str, int] = {}
        for u in newer:
            by_preset[preset[u]] = by_preset.get(preset[u], 0) + 1
        text += "; passed over: " + ", ".join(f"{n} newer {p} run(s)" for p, n in by_preset.items())
    return text


def read_run_claims(run: Run, root: Path, problems: list[str]) -> pd.DataFrame | None:
    """The run's claims with the contract's columns, or None (with one line in `problems`) when unusable."""
    path = run.path / CLAIMS_FILE
    where = _rel(run.path, root)
    if not path.is_file():
        return None  # an experiment may check no claim; not a problem
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as err:
        problems.append(f"{where}: claims.csv is corrupt or truncated ({type(err).__name__}); its claims are left out")
        return None
    if "id" not in frame.columns and "claim" in frame.columns:
        problems.append(f"{where}: claims.csv is from an older version without claim ids "
                        f"({len(frame)} claims left out; re-run the experiment)")
        return None
    lacking = [c for c in CHECK_COLUMNS if c not in frame.columns]
    if lacking:
        problems.append(f"{where}: claims.csv is corrupt (no {', '.join(lacking)} column); its claims are left out")
        return None
    if "measure" not in frame.columns:  # written before claims said what their number is
        frame["measure"] = ""
    frame = frame[CLAIM_COLUMNS].copy()
    frame["measure"] = frame["measure"].fillna("").astype(str)
    broken = frame["id"].isna() | frame["passed"].isna() | ~frame["passed"].astype(str).isin(["True", "False"])
    broken |= ~frame["comparison"].isin(["<=", ">=", "within"])
    if broken.any():
        problems.append(f"{where}: claims.csv has {int(broken.sum())} truncated or malformed row(s); left out")
        frame = frame[~broken]
    frame["passed"] = frame["passed"].astype(str) == "True"
    for col in ("paper_value", "measured", "tolerance"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def build_report(root: Path, all_runs: bool = False) -> Report:
    root = Path(root)
    problems: list[str] = []
    runs = find_runs(root, problems) if root.is_dir() else []
    if not root.is_dir():
        problems.append(f"{root}: no such folder")
    elif not runs:
        problems.append(f"{root}: no run folders (run.json) found")
    reasons: dict[str, str] = {}
    chosen, failed = select_runs(runs, all_runs, reasons)
    frames = []
    for run in chosen:
        claims = read_run_claims(run, root, problems)
        if claims is None or claims.empty:
            continue
        claims.insert(0, "experiment", run.experiment)
        claims.insert(0, "paper", _paper_of(run.experiment))
        claims["run"] = _rel(run.path, root)
        claims["preset"] = run.preset
        claims["job"] = run.path.name if run.sweep else ""
        claims["unit"] = _rel(run.unit, root)
        frames.append(claims)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CLAIM_TABLE)
    seen = {r.experiment for r in runs}
    missing = [n for n in registry.experiment_names() if n not in seen]
    return Report(root, table, chosen, failed, missing, problems, found=runs, reasons=reasons)


def _paper_of(experiment: str) -> str:
    try:
        return registry.paper_package(experiment)
    except Exception:  # an experiment that is no longer registered
        return OTHER


def _paper_titles() -> dict[str, str]:
    titles = {}
    for exp in registry.all_experiments():
        titles.setdefault(registry.paper_package(exp.name), exp.paper)
    return titles


def _figures_of(name: str) -> str:
    try:
        return registry.get(name).figures
    except Exception:
        return ""


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) or "."
    except ValueError:
        return str(path)


# -- formatting ------------------------------------------------------------------------------------


def fmt(value) -> str:
    """Numbers the way a reader wants them: 3 significant digits, nothing for empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{float(value):.3g}"


def criterion(row) -> str:
    """'≤ 1.19e−05', '≥ 3', 'within ±0.1'."""
    if row["comparison"] == "within":
        return f"within ±{fmt(row['tolerance'])}"
    return {"<=": "≤ ", ">=": "≥ "}[row["comparison"]] + fmt(row["tolerance"])


def paper_groups(report: Report) -> list[tuple[str, str, pd.DataFrame]]:
    """(package, title, claims) per paper with runs or registered experiments, in PAPER_PACKAGES order."""
    titles = _paper_titles()
    packages = [p for p in registry.PAPER_PACKAGES]
    shown = report.shown
    if (shown["paper"] == OTHER).any():
        packages.append(OTHER)
    out = []
    for package in packages:
        rows = shown[shown["paper"] == package]
        out.append((package, titles.get(package, package), rows))
    return out


def summary_line(rows: pd.DataFrame) -> str:
    """`3/4 claims passed` (+ how many of the failures are preset=smoke's expected ones)."""
    passed = int(rows["passed"].sum()) if len(rows) else 0
    expected = int(rows["expected"].sum()) if len(rows) and "expected" in rows else 0
    smoke = f" ({expected} failed as expected at preset=smoke, not counted by --strict)" if expected else ""
    return f"{passed}/{len(rows)} claims passed{smoke}"


def runs_line(report: Report) -> str:
    """The summary's second half: runs shown, runs not complete among all found (by status), never run."""
    counts = report.not_complete_counts()
    detail = f" ({', '.join(f'{n} {status}' for status, n in counts.items())})" if counts else ""
    return (f"over {len(report.runs)} run(s) shown; {sum(counts.values())} of the {len(report.found)} run(s) found "
            f"not complete{detail}; {len(report.missing)} experiment(s) never run.")


def _runs_of(report: Report, package: str) -> list[Run]:
    return [r for r in report.runs if _paper_of(r.experiment) == package]


def _not_run(report: Report, package: str) -> tuple[list[Run], list[str]]:
    failed = [r for r in report.failed if _paper_of(r.experiment) == package]
    missing = [n for n in report.missing if _paper_of(n) == package]
    return failed, missing


def _run_state(run: Run) -> str:
    error = run.record.get("error")
    status = "running (or died without saying so)" if run.status == "running" else run.status
    return status + (f" ({error})" if error else "")


def _figure_files(report: Report, package: str) -> list[tuple[str, Path]]:
    """(experiment, png) for the shown runs: a sweep's combined figures once, else each run's."""
    out, seen = [], set()
    for run in _runs_of(report, package):
        folder = run.sweep if run.sweep and (run.sweep / FIGURES_DIR).is_dir() else run.path
        if folder in seen:
            continue
        seen.add(folder)
        out += [(run.experiment, p) for p in sorted((folder / FIGURES_DIR).glob("*.png"))]
    return out


# -- markdown --------------------------------------------------------------------------------------

CLAIM_HEADER = ["Claim", "Ref", "Paper", "Measured", "Tolerance", "Result", "Run", "Preset"]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _measured(row) -> str:
    """One run's value, or a sweep's range over its jobs: `0.12 … 0.47 (3 jobs)`."""
    if row.get("jobs", 1) > 1:
        lo, hi = fmt(row["measured_min"]), fmt(row["measured_max"])
        return (lo if lo == hi else f"{lo} … {hi}") + f" ({row['jobs']} jobs)"
    return fmt(row["measured"])


def result_text(row, bold: str = "**") -> str:
    """pass / FAIL / FAIL (1 of 3 jobs) / fail (expected at preset=smoke)."""
    if row["passed"]:
        return "pass"
    if row.get("expected"):
        return "fail (expected at smoke)"
    jobs = row.get("jobs", 1)
    return f"{bold}FAIL{bold}" + (f" ({jobs - row['jobs_passed']} of {jobs} jobs)" if jobs > 1 else "")


def _claim_cells(row) -> list[str]:
    run = row["unit"] if row.get("jobs", 1) > 1 else row["run"] + (f" (job {row['job']})" if row["job"] else "")
    measure = row.get("measure") or ""
    measured = _measured(row) + (f" = {measure}" if measure else "")
    return [f"`{row['id']}`", row["ref"], fmt(row["paper_value"]), measured, criterion(row),
            result_text(row), run, row["preset"]]


def render_markdown(report: Report) -> str:
    total = report.shown
    lines = [f"# icl-exp report: {report.root}", "", f"{summary_line(total)} {runs_line(report)}", ""]
    if report.problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in report.problems] + [""]
    for package, title, rows in paper_groups(report):
        failed, missing = _not_run(report, package)
        if rows.empty and not failed and not missing and not _runs_of(report, package):
            continue
        lines += [f"## {title} — {summary_line(rows)}", "", *runs_table(report, package)]
        for name, group in rows.groupby("experiment", sort=True):
            lines += [f"### {name} ({_figures_of(name)})", ""]
            if name in report.reasons:
                lines += [f"Shown: {report.reasons[name]}.", ""]
            lines += ["| " + " | ".join(CLAIM_HEADER) + " |", "|" + "---|" * len(CLAIM_HEADER)]
            lines += ["| " + " | ".join(_md_cell(c) for c in _claim_cells(r)) + " |" for _, r in group.iterrows()]
            lines += ["", *[f"- `{r['id']}`: {r['description']}" for _, r in group.iterrows()], ""]
        for r in failed:
            lines.append(f"- **not complete**: {r.experiment} — {_rel(r.path, report.root)}: {_run_state(r)}")
        for name in missing:
            lines.append(f"- **missing**: {name} has no run under {report.root}")
        figures = _figure_files(report, package)
        if figures:
            lines += ["", "Figures:", ""]
            lines += [f"- {exp}: [{png.name}]({_rel(png, report.root)})" for exp, png in figures]
        lines.append("")
    return "\n".join(lines)


# -- html ------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px;width:100%}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.fail td{background:#fde8e8} td.pass{color:#176c2f;font-weight:600} td.fail{color:#b00020;font-weight:700}
td.expected{color:#8a6d00}
code{font-size:12px} .problems li{color:#b00020} .summary{font-size:15px;font-weight:600}
figure{display:inline-block;margin:.5em;vertical-align:top} figure img{max-width:560px;border:1px solid #ddd}
figcaption{font-size:12px;color:#555} .desc{color:#555;font-size:12px}
"""


def _thumbnail(png: Path) -> str | None:
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


def render_html(report: Report) -> str:
    e = html.escape
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>icl-exp report</title><style>{CSS}</style></head><body>",
           f"<h1>icl-exp report</h1><p>Results folder <code>{e(str(report.root))}</code></p>",
           f"<p class='summary'>{e(summary_line(report.shown))} {e(runs_line(report))}</p>"]
    if report.problems:
        out.append("<h2>Problems</h2><ul class='problems'>" + "".join(f"<li>{e(p)}</li>" for p in report.problems)
                   + "</ul>")
    for package, title, rows in paper_groups(report):
        failed, missing = _not_run(report, package)
        if rows.empty and not failed and not missing and not _runs_of(report, package):
            continue
        out.append(f"<h2 id='{e(package)}'>{e(title)} — {e(summary_line(rows))}</h2>")
        for name, group in rows.groupby("experiment", sort=True):
            why = f"<p class='desc'>Shown: {e(report.reasons[name])}.</p>" if name in report.reasons else ""
            out.append(f"<h3>{e(name)} <small>({e(_figures_of(name))})</small></h3>{why}<table><tr>"
                       + "".join(f"<th>{h}</th>" for h in CLAIM_HEADER) + "</tr>")
            for _, r in group.iterrows():
                cells = _claim_cells(r)
                cls = "pass" if r["passed"] else "expected" if r["expected"] else "fail"  # smoke's: not red
                out.append(
                    f"<tr class='{cls}'><td><code>{e(r['id'])}</code>"
                    f"<div class='desc'>{e(str(r['description']))}</div></td><td>{e(str(r['ref']))}</td>"
                    + "".join(f"<td class='num'>{e(c)}</td>" for c in cells[2:5])
                    + f"<td class='{cls}'>{e(result_text(r, bold=''))}</td>"
                    f"<td><code>{e(cells[6])}</code></td><td>{e(cells[7])}</td></tr>")
            out.append("</table>")
        if failed or missing:
            out.append("<ul class='problems'>")
            out += [f"<li>not complete: {e(r.experiment)} — <code>{e(_rel(r.path, report.root))}</code>: "
                    f"{e(_run_state(r))}</li>" for r in failed]
            out += [f"<li>missing: {e(n)} has no run</li>" for n in missing]
            out.append("</ul>")
        for exp, png in _figure_files(report, package):
            uri = _thumbnail(png)
            if uri:
                out.append(f"<figure><img src='{uri}' alt='{e(png.name)}'>"
                           f"<figcaption>{e(exp)}: {e(png.name)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


# -- README tables ---------------------------------------------------------------------------------


def runs_table(report: Report, package: str) -> list[str]:
    """Markdown rows: which run each paper's numbers come from (preset, device, dtype, wall time, claims)."""
    runs = _runs_of(report, package)
    if not runs:
        return []
    lines = ["| Experiment | Run | Preset | Device | Wall | Claims |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r.experiment, str(r.path))):
        wall = r.record.get("wall_time_s")
        claims = f"{r.record.get('claims_passed', '')}/{r.record.get('claims_total', '')}"
        lines.append(f"| {r.experiment} | {_md_cell(_rel(r.path, report.root))} | {r.preset} | "
                     f"{r.record.get('device', '')} {r.record.get('dtype', '')} | "
                     f"{'' if wall is None else f'{float(wall):.0f} s'} | {claims} |")
    return lines + [""]


def readme_tables(report: Report) -> str:
    """The README's "Results measured here" tables: per paper, the runs they come from, then one row per claim."""
    lines = []
    for package, title, rows in paper_groups(report):
        if rows.empty:
            continue
        lines += [f"**{title}** — {summary_line(rows)}", "", *runs_table(report, package),
                  "| Experiment | Claim | Ref | Paper | Measured | Tolerance | Result | Preset |",
                  "|---|---|---|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            c = _claim_cells(r)
            cells = (r["experiment"], c[0], c[1], c[2], c[3], c[4], c[5], c[7])
            lines.append("| " + " | ".join(_md_cell(x) for x in cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def update_readme(readme: Path, report: Report) -> None:
    """Rewrite the text between README_BEGIN and README_END in `readme` with `readme_tables(report)`."""
    text = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {README_BEGIN} ... {README_END} markers to fill")
    body = f"{README_BEGIN}\n<!-- generated by `icl-exp report RESULTS_DIR --readme {readme.name}`; edits here are "\
           f"overwritten -->\n\n{readme_tables(report)}\n{README_END}"
    readme.write_text(pattern.sub(lambda _: body, text, count=1))


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    from experiments.core.atomic import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    md, page = out_dir / REPORT_MD, out_dir / REPORT_HTML
    markdown, html_text = render_markdown(report), render_html(report)
    write_atomic(md, lambda p: Path(p).write_text(markdown))
    write_atomic(page, lambda p: Path(p).write_text(html_text))
    return md, page


# -- the page in a real browser --------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    import shutil

    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


def screenshot_html(page: Path, png: Path, width: int = 1280, height: int = 2400, timeout: float = 180) -> Path:
    """Render `page` in headless Chromium and save a screenshot: what a reader's browser shows, not a string.

    --no-sandbox because CI containers run as root, where Chromium's sandbox refuses to start."""
    import subprocess

    browser = find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={png}", Path(page).resolve().as_uri()],
                   check=True, capture_output=True, timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot of {page}")
    return png
