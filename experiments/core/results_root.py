"""A folder of many experiments' runs (the repository's results/): the runs in it, its manifest, and every
figure the docs show, drawn from it alone (`icl-exp plot results/`).

    results/<experiment>/<label>/     one run folder or one sweep folder, as `icl-exp run` writes it; the
                                      committed ones are labelled by what they are (`paper`, `qwen2.5-0.5b`),
                                      a user's own keep their time stamps
    results/README.md                 the manifest, generated: every run, its command, commit, machine, wall time

What the repository keeps of a run is its tables and records (COMMITTED_SUFFIXES), never weights, figures or a
checkpoint's files (CHECKPOINT_FILES); a large metrics.csv or samples.jsonl is kept gzipped (compact), which
every reader takes.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from experiments.core import registry
from experiments.core.atomic import write_atomic, write_text_atomic
from experiments.core.errors import UserError
from experiments.core.figures import is_run_dir, is_sweep_dir, job_dirs, render_multirun, render_run, run_state
from experiments.core.plotting import SOURCE_KEY
from experiments.core.results import GZIP_SUFFIX
from experiments.core.run_folder import CLAIMS_FILE, FIGURES_DIR, METRICS_FILE, RUN_FILE

log = logging.getLogger(__name__)

MANIFEST = "README.md"
# what a committed run keeps (tests/core/test_committed_results.py holds results/ to it and to the size budget)
COMMITTED_SUFFIXES = (".csv", ".csv.gz", ".json", ".jsonl", ".jsonl.gz", ".yaml", ".md", ".log", ".png")
SIZE_BUDGET_BYTES = 25 * 1024 * 1024
# a saved transformers checkpoint's own files (a run that keeps its patched model beside its tables:
# context_compile, patch_export): weights, config and tokenizer are the checkpoint, not a result
CHECKPOINT_FILES = frozenset({"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                              "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.json",
                              "merges.txt", "tokenizer.model", "model.safetensors.index.json"})
SURVEY_DIR = "models"  # the family survey kept beside the runs (not a run: patching/survey_record.py writes it)
SURVEY_TABLE, SURVEY_RECORD = "survey.csv", "survey.json"  # its table and where it came from
GZIP_ABOVE_BYTES = 64 * 1024  # a metrics table or samples file larger than this is kept gzipped


@dataclass(frozen=True)
class Unit:
    """One run, or one sweep drawn as one (its jobs' metrics combined), under results/<experiment>/."""

    path: Path
    experiment: str
    label: str  # its folder under results/<experiment>/, '/' written '-': `paper`, `multirun-2026-11-28_...`
    sweep: bool

    @property
    def runs(self) -> list[Path]:
        return job_dirs(self.path) if self.sweep else [self.path]

    def records(self) -> list[dict]:
        out = []
        for run in self.runs:
            try:
                out.append(json.loads((run / RUN_FILE).read_text()))
            except (OSError, ValueError):
                out.append({})
        return out


def is_results_root(path: Path) -> bool:
    """A folder of experiments' folders (results/), not itself a run or a sweep."""
    path = Path(path)
    if not path.is_dir() or is_run_dir(path) or is_sweep_dir(path):
        return False
    names = set(registry.experiment_names())
    return any(child.is_dir() and child.name in names for child in path.iterdir())


def find_units(root: Path) -> list[Unit]:
    """Every run and sweep under root/<experiment>/, in experiment then label order; a sweep's jobs are
    part of it, not units of their own."""
    units = []
    names = set(registry.experiment_names())
    for exp_dir in sorted(p for p in Path(root).iterdir() if p.is_dir() and p.name in names):
        pending = sorted(p for p in exp_dir.iterdir() if p.is_dir())
        while pending:
            folder = pending.pop(0)
            label = folder.relative_to(exp_dir).as_posix().replace("/", "-")
            if is_run_dir(folder):
                units.append(Unit(folder, exp_dir.name, label, sweep=False))
            elif job_dirs(folder) and is_sweep_dir(folder):
                units.append(Unit(folder, exp_dir.name, label, sweep=True))
            else:  # e.g. results/<experiment>/multirun/<stamp>
                pending[:0] = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return units


def doc_figure_name(unit: Unit, drawn: Path) -> str:
    """`dw_convergence-paper-fig3_dynamics.png`: experiment, run label, the figure's own name."""
    return f"{unit.experiment}-{unit.label}-{drawn.name}"


def draw_units(units: list[Unit]) -> dict[str, Path]:
    """Each unit's figures drawn again from its tables into its own figures/ folder: {docs name: PNG drawn}.
    A unit that cannot be drawn stops everything with one line naming it (nothing is copied yet)."""
    drawn: dict[str, Path] = {}
    for unit in units:
        if not getattr(registry.get(unit.experiment), "draws_figures", True):
            continue
        states = [run_state(r) for r in unit.runs]
        if not unit.sweep and states[0] != "complete":
            log.warning("%s is %s: left out of the figures", unit.path, states[0])
            continue
        try:
            paths = render_multirun(unit.path, warn=True) if unit.sweep else render_run(unit.path)
        except UserError as err:
            raise UserError(f"{unit.path}: {err}") from None
        for path in paths:
            if path.suffix == ".png":
                drawn[doc_figure_name(unit, path)] = path
    return drawn


def png_source(path: Path) -> str | None:
    """The table a PNG says it was drawn from (plotting.SOURCE_KEY), or None for a figure from elsewhere."""
    from PIL import Image

    with Image.open(path) as image:
        return getattr(image, "text", {}).get(SOURCE_KEY)


def copy_figures(drawn: dict[str, Path], into: Path) -> list[Path]:
    """The drawn PNGs into `into` (docs/figures), each atomically; a figure there that an earlier redraw wrote
    (it carries SOURCE_KEY) and this one did not is removed, so docs/figures holds no figure without a run."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source in sorted(drawn.items()):
        target = into / name
        write_atomic(target, lambda tmp, source=source: shutil.copyfile(source, tmp))
        written.append(target)
    for old in into.glob("*.png"):
        if old.name not in drawn and png_source(old) is not None:
            old.unlink()
    return written


def _machine(record: dict) -> str:
    host = record.get("host") or {}
    cpu, cores = host.get("cpu"), host.get("cores")
    if not cpu:
        return "?"
    return f"{cpu}, {cores} cores" if cores else str(cpu)


def _overrides(records: list[dict]) -> str:
    """The command line's overrides: those every job shares, then each swept key with its values."""
    lists = [[o for o in (r.get("overrides") or []) if not o.startswith(("experiment=", "hydra."))] for r in records]
    if not lists:
        return ""
    shared = [o for o in lists[0] if all(o in other for other in lists[1:])]
    swept: dict[str, list[str]] = {}
    for overrides in lists:
        for o in overrides:
            if o not in shared and "=" in o:
                key, value = o.split("=", 1)
                if value not in swept.setdefault(key, []):
                    swept[key].append(value)
    return " ".join([*shared, *(f"{k}={','.join(v)}" for k, v in swept.items())])


def _wall(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _claims(unit: Unit) -> str:
    import pandas as pd

    passed = total = 0
    for run in unit.runs:
        if (run / CLAIMS_FILE).is_file():
            frame = pd.read_csv(run / CLAIMS_FILE)
            total += len(frame)
            passed += int(frame["passed"].astype(str).str.lower().eq("true").sum()) if "passed" in frame else 0
    return f"{passed}/{total}" if total else ""


def manifest_text(root: Path, units: list[Unit]) -> str:
    """results/README.md: what each committed run is, the command that makes it again, and where it ran."""
    lines = ["# results/: the runs the docs are drawn from", "",
             "<!-- generated by `icl-exp plot results/` from each run's run.json: edits here are overwritten -->", "",
             "Every figure in docs/figures and every number the docs quote is read from these folders; "
             "`icl-exp plot results/` (or `nox -s figures`) draws them all again from the tables alone, "
             "offline, without running an experiment. A folder is a run as `icl-exp run` writes it "
             "(`run.json`, `claims.csv`, `metrics.csv`, `.hydra/`; a large metrics table gzipped, weights and "
             "figures left out); a sweep is a folder of numbered jobs. To make one again: "
             "`icl-exp run EXPERIMENT OVERRIDES` (a sweep with `-m`), on the commit it names.", "",
             "| run | experiment | preset | overrides | jobs | commit | started | machine | wall | claims |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for unit in units:
        records = unit.records()
        first = records[0] if records else {}
        commits = sorted({str((r.get("git") or {}).get("commit") or "?")[:7] for r in records})
        dirty = any((r.get("git") or {}).get("dirty") for r in records)
        wall = sum(float(r.get("wall_time_s") or 0) for r in records)
        cells = [f"`{unit.path.relative_to(root).as_posix()}`", unit.experiment, str(first.get("preset", "")),
                 f"`{_overrides(records)}`" if _overrides(records) else "", str(len(records)),
                 ", ".join(commits) + (" (+ local changes)" if dirty else ""), str(first.get("start", ""))[:10],
                 _machine(first), _wall(wall), _claims(unit)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines + _survey_lines(Path(root))) + "\n"


def _survey_lines(root: Path) -> list[str]:
    """The family survey kept beside the runs (results/models: `icl-exp models --refresh --out results/models`,
    patching/survey_record.py), which docs/models.md's counts are written from; none when it is not there."""
    record_file = root / SURVEY_DIR / SURVEY_RECORD
    if not record_file.is_file():
        return []
    record = json.loads(record_file.read_text())
    commit = str((record.get("git") or {}).get("commit") or "?")[:7]
    families, computed = record.get("families", "?"), record.get("computed", 0)
    how = (_wall(float(record.get("wall_time_s") or 0)) if computed == families
           else f"{computed} of its {families} answers computed, the others read from the survey's cache")
    return ["", f"`{SURVEY_DIR}/{SURVEY_TABLE}` is not a run: the family survey (made again by "
                f"`icl-exp models --refresh --out results/{SURVEY_DIR}`; every causal-LM family of transformers "
                f"{record.get('transformers', '?')}: "
                f"{families}), commit {commit}, {str(record.get('date', ''))[:10]}, {_machine(record)}, {how}; "
                f"its record is `{SURVEY_DIR}/{SURVEY_RECORD}`."]


def write_manifest(root: Path, units: list[Unit]) -> Path:
    path = Path(root) / MANIFEST
    write_text_atomic(path, manifest_text(Path(root), units))
    return path


def committed_files(run_dir: Path) -> list[Path]:
    """The files of a run or sweep folder the repository keeps (COMMITTED_SUFFIXES, outside figures/): what
    `git add -f` takes when a run is added to results/."""
    run_dir = Path(run_dir)

    def kept(path: Path) -> bool:
        parts = path.relative_to(run_dir).parts
        return (path.is_file() and FIGURES_DIR not in parts and path.name.endswith(COMMITTED_SUFFIXES)
                and path.name not in CHECKPOINT_FILES)

    return sorted(p for p in run_dir.rglob("*") if kept(p))


def compact(run_dir: Path, threshold: int = GZIP_ABOVE_BYTES) -> list[Path]:
    """A metrics.csv or samples.jsonl above `threshold` bytes replaced by its gzipped copy (the same table:
    readers take either), in a run folder or in every job of a sweep folder; returns the files written. mtime 0
    in the gzip header, so compacting the same table twice gives the same bytes."""
    import gzip

    from experiments.core.samples import SAMPLES_FILE

    written = []
    tables = [*Path(run_dir).rglob(METRICS_FILE), *Path(run_dir).rglob(SAMPLES_FILE)]
    for table in tables:
        if FIGURES_DIR in table.parts or table.stat().st_size <= threshold:
            continue
        target = table.with_name(table.name + GZIP_SUFFIX)
        data = table.read_bytes()

        def write(tmp: Path, data: bytes = data) -> None:
            with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
                out.write(data)

        write_atomic(target, write)
        table.unlink()
        written.append(target)
    return written


if __name__ == "__main__":  # python -m experiments.core.results_root RUN_OR_SWEEP ...: ready a run for results/
    import sys

    for folder in sys.argv[1:]:
        compact(Path(folder))
        print("\n".join(str(p) for p in committed_files(Path(folder))))
