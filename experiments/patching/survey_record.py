"""`icl-exp models --out DIR`: the family survey (arch/survey.py) kept as a table beside its record, as
results/models/ holds it, and the counts docs/models.md shows, written from it by `icl-exp plot results/`
(report/quoted.py's `table:` marker).

    DIR/survey.csv    model_type, status, detail: one row per causal-LM family, the lines `icl-exp models` prints
    DIR/survey.json   where the answers came from: transformers' version and the adapter code's digest (the
                      cache's key), the commit, the date, the machine, the wall time, how many answers were
                      computed by this call (the others were read from the cache) and whether every family
                      transformers knows was asked

Kept outside patching/arch/, whose sources key the survey's cache: writing the record does not make the cached
answers stale.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from experiments.core.errors import UserError
from experiments.core.results_root import SURVEY_RECORD, SURVEY_TABLE

TABLE, RECORD = SURVEY_TABLE, SURVEY_RECORD  # core/results_root.py names them (it lists results/ without patching)
STATUSES = ("adapter file", "module tree", "refused", "not checked")  # arch/survey.py's, in the page's order
STATUS_LABEL = {"adapter file": "by an adapter file",
                "module tree": "by their module tree (the check chose the form)",
                "refused": "refused (the line says why)",
                "not checked": "not checked (no tiny model, or over the limit)"}


# why a family is refused, by the words of its line (arch/structure.py, arch/check.py): the page's second table
REASONS = (("different MLPs", "dense and sparse MLPs in different layers (the engine holds one adapter per model)"),
           ("candidates for the mixer", "more than one candidate for the mixer (modules that mix positions)"),
           ("candidates for the MLP", "more than one candidate for the MLP (weighted paths that do not mix positions)"),
           ("does not describe", "the float64 check on a tiny model fails (its line: the step that fails)"),
           ("no MLP after", "no MLP after the mixer"),
           ("no list of decoder layers", "no decoder list, no output rule, or no form the tree names"),
           ("has no matrices reading z", "no decoder list, no output rule, or no form the tree names"),
           ("no form of Table 1 fits", "no decoder list, no output rule, or no form the tree names"))
OTHER = "another reason (its line)"


def reason(detail: str) -> str:
    return next((label for words, label in REASONS if words in detail), OTHER)


def write(out: Path, rows, *, wall_s: float, computed: int, complete: bool) -> list[Path]:
    """DIR/survey.csv and DIR/survey.json from the survey's rows (FamilyStatus), each written atomically."""
    import transformers

    from experiments.core.atomic import write_json_atomic, write_text_atomic
    from experiments.core.provenance import git_state, host
    from experiments.patching.arch.survey import cache_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([{"model_type": r.model_type, "status": r.status, "detail": r.detail} for r in rows])
    write_text_atomic(out / TABLE, frame.to_csv(index=False))
    digest = cache_file().stem.rsplit("-", 1)[-1]
    record = {"command": "icl-exp models" + ("" if complete else " TYPE..."),
              "transformers": transformers.__version__, "adapter_digest": digest, "git": git_state(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": host(),
              "wall_time_s": round(wall_s, 1), "computed": computed, "families": len(frame), "complete": complete}
    write_json_atomic(out / RECORD, record)
    return [out / TABLE, out / RECORD]


def read(folder: Path) -> tuple[pd.DataFrame, dict]:
    folder = Path(folder)
    if not (folder / TABLE).is_file() or not (folder / RECORD).is_file():
        raise UserError(f"{folder} holds no family survey ({TABLE} and {RECORD}): `icl-exp models --out {folder}`")
    return pd.read_csv(folder / TABLE, keep_default_na=False), json.loads((folder / RECORD).read_text())


def page_table(folders: list[Path]) -> str:
    """docs/models.md's counts: families per status, and where the survey ran."""
    from experiments.core.results_root import _wall

    if len(folders) != 1:
        raise UserError(f"the family counts read one survey, not {len(folders)}")
    frame, record = read(folders[0])
    counts = frame["status"].value_counts()
    lines = [f"| `icl-exp models`, transformers {record['transformers']} | families |", "|---|---|"]
    for status in [*STATUSES, *(s for s in counts.index if s not in STATUSES)]:
        if status in counts:
            lines.append(f"| {STATUS_LABEL.get(status, status)} | {int(counts[status])} |")
    asked = "" if record.get("complete") else " (those asked)"
    lines.append(f"| every causal-LM type it knows{asked} | {len(frame)} |")
    refused = frame[frame["status"] == "refused"]
    if len(refused):
        why = refused.assign(reason=refused["detail"].map(reason)).groupby("reason", sort=False)["model_type"]
        order = list(dict.fromkeys([label for _, label in REASONS] + [OTHER]))
        lines += ["", "| refused: why | families | `model_type` |", "|---|---|---|"]
        for label in sorted(why.groups, key=order.index):
            types = sorted(why.get_group(label))
            lines.append(f"| {label} | {len(types)} | {', '.join(f'`{t}`' for t in types)} |")
    commit = str((record.get("git") or {}).get("commit") or "?")[:7]
    cpu = (record.get("host") or {}).get("cpu") or "?"
    cores = (record.get("host") or {}).get("cores")
    computed = record.get("computed", 0)
    how = (f"{_wall(float(record['wall_time_s']))} wall, all {computed} answers computed" if computed == len(frame)
           else f"{computed} of {len(frame)} answers computed, the others read from the cache")
    lines += ["", f"(The survey kept in [results/models](../results/models/{TABLE}): commit {commit}, "
                  f"{str(record.get('date', ''))[:10]}, {cpu}" + (f", {cores} cores" if cores else "")
              + f"; {how}; the adapter code's digest {record.get('adapter_digest', '?')}.)"]
    return "\n".join(lines)
