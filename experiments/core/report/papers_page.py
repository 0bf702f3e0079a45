"""docs/papers.md: the four papers beside the tool, item by item, generated from results/ and the one
hand-kept table of the papers' own numbers (docs/paper_items.yaml).

Per item: what the paper shows, its value and scale; the committed run that reproduces it, the claims it
measured there, the run's scale; the figure's thumbnail; and a verdict that is computed, never typed:

    reproduced                        every listed claim passes, on a run at the paper's settings
    reproduced at a smaller scale     every listed claim passes, on a smaller run (preset cpu or smoke)
    differs                           a listed claim fails; the item's `reason` (hand-written, its numbers
                                      quoted from results/ by report/quoted.py markers) says what the control
                                      or ablation measured
    drawn, not judged                 the run draws the figure but checks no claim for it
    not run here                      no experiment, or no committed run: what it needs, and the command
    nothing to measure                a diagram, or a table of ✓/× without numbers

An item may name its run (`run: patch_match/qwen2.5-0.5b`); else the experiment's `paper` run, else its first.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.core.results_root import Unit, doc_figure_name
from experiments.core.run_folder import CLAIMS_FILE

PAPERS = {"dherin": "Dherin et al., *Learning without training*",
          "goldwaser": "Goldwaser et al., *Equivalence of context and parameter updates in modern transformer blocks*",
          "karbevski": "Karbevski & Mijoski, *W_K, W_V is probably all you need*",
          "xu_fang": "Xu & Fang, *Self-attention as a covariance readout*"}
# verdicts beside which the item says what the paper's own scale needs (a GPU, a gated hub model)
SCALE_NOTED = ("reproduced at a smaller scale", "differs", "drawn, not judged")
VERDICTS = ("reproduced", "reproduced at a smaller scale", "differs", "drawn, not judged", "not run here",
            "nothing to measure")


@dataclass(frozen=True)
class Judged:
    verdict: str
    here: str  # the claims measured, one per line
    scale: str


def load_items(path: Path) -> list[dict]:
    import yaml

    items = yaml.safe_load(Path(path).read_text()) or []
    for item in items:
        missing = {"paper", "item", "kind", "shows", "paper_value", "paper_scale", "experiment", "claims"} - set(item)
        if missing:
            raise ValueError(f"{path}: item {item.get('paper')} {item.get('item')} has no {', '.join(sorted(missing))}")
    return items


def pick_unit(item: dict, units: list[Unit], root: Path) -> Unit | None:
    if item.get("run"):
        return next((u for u in units if u.path.relative_to(root).as_posix() == item["run"]), None)
    mine = [u for u in units if u.experiment == item["experiment"]]
    return next((u for u in mine if u.label == "paper"), mine[0] if mine else None)


def _claims(unit: Unit) -> pd.DataFrame:
    frames = []
    for run in unit.runs:
        if (run / CLAIMS_FILE).is_file():
            frame = pd.read_csv(run / CLAIMS_FILE)
            frame["job"] = run.name if unit.sweep else ""
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["id", "passed", "job"])


def _short(value) -> str:
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return ""


def _bar(row) -> str:
    if row["comparison"] == "within":
        return f"within ±{_short(row['tolerance'])} of {_short(row['paper_value'])}"
    return {"<=": "≤ ", ">=": "≥ "}.get(row["comparison"], "") + _short(row["tolerance"])


def _scale(unit: Unit) -> str:
    record = unit.records()[0] if unit.records() else {}
    overrides = [o for o in (record.get("overrides") or []) if not o.startswith(("experiment=", "hydra."))]
    jobs = f", {len(unit.runs)} jobs" if unit.sweep else ""
    return f"preset={record.get('preset', '?')}{jobs}" + (f" ({' '.join(overrides)})" if overrides else "")


def judge(item: dict, unit: Unit | None) -> Judged:
    if item["kind"] == "diagram":  # a figure or table without numbers (a block diagram, a ✓/× summary)
        return Judged("nothing to measure", "", "")
    if not item["experiment"] or unit is None:
        return Judged("not run here", "", "")
    claims = _claims(unit)
    wanted = [c for c in claims.itertuples() if any(fnmatch.fnmatchcase(str(c.id), p) for p in item["claims"])]
    if not wanted:
        return Judged("drawn, not judged" if item.get("figure") else "not run here", "", _scale(unit))
    lines, passed = [], []
    for c in wanted:
        ok = str(c.passed).lower() == "true"
        passed.append(ok)
        job = f" (job {c.job})" if c.job != "" else ""
        row = claims.loc[c.Index]
        lines.append(f"{'✓' if ok else '✗'} `{str(c.id).split('.', 1)[-1]}`{job} {_short(c.measured)} ({_bar(row)})")
    if not all(passed):
        verdict = "differs"
    else:
        presets = {r.get("preset") for r in unit.records()}
        verdict = "reproduced" if presets == {"paper"} else "reproduced at a smaller scale"
    return Judged(verdict, "<br>".join(lines), _scale(unit))


def _what_it_needs(item: dict) -> str:
    """`: needs GPU: ...; `icl-exp run gpt_wq ...``: the item's `needs` and `command` (or the experiment's)."""
    experiment = item["experiment"]
    needs = item.get("needs") or (f"a committed run of `{experiment}`" if experiment else "")
    command = item.get("command") or (f"`icl-exp run {experiment}`" if experiment else "")
    return f": needs {needs}" + (f"; {command}" if command else "") if needs else ""


def _cell(text) -> str:
    return str(text or "").replace("|", "\\|").replace("\n", " ")


def render_papers_page(items: list[dict], root: Path, units: list[Unit], figures: set[str]) -> str:
    """The page; `figures`: the names docs/figures holds (after the redraw), which the thumbnails link."""
    counts: dict[str, int] = {}
    body = []
    for paper, title in PAPERS.items():
        mine = [i for i in items if i["paper"] == paper]
        if not mine:
            continue
        body += [f"## {title}", "", "| item | the paper | the paper's scale | here | here's scale | figure | verdict |",
                 "|---|---|---|---|---|---|---|"]
        for item in mine:
            unit = pick_unit(item, units, root)
            judged = judge(item, unit)
            counts[judged.verdict] = counts.get(judged.verdict, 0) + 1
            thumb = ""
            if unit is not None and item.get("figure"):
                name = doc_figure_name(unit, Path(f"{item['figure']}.png"))
                if name in figures:
                    thumb = f'<a href="figures/{name}"><img src="figures/{name}" width="140"></a>'
            verdict = f"**{judged.verdict}**"
            if item.get("reason") and judged.verdict in ("differs", "drawn, not judged"):
                verdict += f": {item['reason'].strip()}"
            elif judged.verdict == "not run here":
                verdict += _what_it_needs(item)
            if judged.verdict in SCALE_NOTED and item.get("needs"):
                verdict += f"<br>the paper's scale needs {item['needs']}"
                if item.get("command"):
                    verdict += f": {item['command']}"
            where = f"`{unit.path.relative_to(root).as_posix()}`<br>" if unit is not None and judged.here else ""
            shows = f"{item['shows']}" + (f"<br>*{item['paper_value']}*" if item["paper_value"] else "")
            cells = [f"{item['item']}", shows, item["paper_scale"], where + judged.here, judged.scale, thumb, verdict]
            body.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        body.append("")
    tally = "; ".join(f"{v}: {counts[v]}" for v in VERDICTS if counts.get(v))
    head = ["# The four papers beside the tool", "",
            "<!-- generated by `icl-exp plot results/` from docs/paper_items.yaml and results/: edits here are "
            "overwritten -->", "",
            "Every figure, table and headline number of the four papers (the papers' own values kept by hand in "
            "[paper_items.yaml](paper_items.yaml)), beside what the committed runs in [results/](../results/README.md) "
            "measured. The verdict is computed from the runs' claims: *reproduced* (every claim passes at the "
            "paper's settings), *reproduced at a smaller scale* (they pass on a smaller run), *differs* (a claim "
            "fails; the reason says what a control or ablation measured), *drawn, not judged* (the figure is "
            "drawn, no claim checks it), *not run here* (what it needs, and the command), *nothing to measure* (a "
            "diagram, a table of ✓/×).", "",
            f"{len(items)} items: {tally}.", ""]
    return "\n".join(head + body)


def papers_page(items_file: Path, root: Path, units: list[Unit], figures: set[str]) -> str:
    """The page's text, its quoted numbers still to fill (report/quoted.py)."""
    return render_papers_page(load_items(items_file), Path(root), units, figures)
