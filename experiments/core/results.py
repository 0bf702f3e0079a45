"""The run directory contract (docs/design.md, "The run folder"): metrics.csv, claims.csv, run.json, figures/.

`RunContext` is what an experiment's `run(cfg, ctx)` writes through. Metrics are tidy and long:
one row per measurement, `experiment, run_id, metric, value` plus index columns. They are
flushed atomically now and then, so a crash keeps what was measured so far.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.core import progress
from experiments.core.atomic import write_atomic
from experiments.core.run_folder import CLAIMS_FILE, FIGURES_DIR, METRICS_FILE

# The claim contract (docs/design.md, "The run folder"): a stable id, the paper's reference, a description with
# no measured numbers in it, the paper's number (or empty), what this run measured, and how the two are compared:
#   comparison "<="     passes when measured <= tolerance       (tolerance is the bound)
#   comparison ">="     passes when measured >= tolerance       (tolerance is the bar to clear)
#   comparison "within" passes when |measured - paper_value| <= tolerance
# `measure` (optional, last) names the number in `measured` in a few symbols, for the console and the
# report: "log10(control L∞ / patched L∞)". Older claims.csv files have no such column.
CHECK_COLUMNS = ["id", "ref", "description", "paper_value", "measured", "tolerance", "comparison", "passed"]
CLAIM_COLUMNS = [*CHECK_COLUMNS, "measure", "exact"]
COMPARISONS = ("<=", ">=", "within")
_CLAIM_ID = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
METRIC_LEAD_COLUMNS = ["experiment", "run_id", "metric", "value"]


def write_csv_atomic(path: Path, frame: pd.DataFrame) -> None:
    write_atomic(path, lambda p: frame.to_csv(p, index=False))


# Callables handed each row ctx.log writes, as it is written: the trackers (core/trackers.py, logger=...)
_SINKS: list = []


def add_sink(sink) -> None:
    _SINKS.append(sink)


def remove_sink(sink) -> None:
    if sink in _SINKS:
        _SINKS.remove(sink)


def _as_scalar(value: Any) -> Any:
    """Tensors and numpy scalars to plain python, so CSVs hold numbers, not reprs."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


@dataclass
class RunContext:
    """Where an experiment puts what it measures."""

    run_dir: Path
    experiment: str
    run_id: str
    device: Any = None  # torch.device the run uses (resolved from cfg.device)
    dtype: Any = None  # torch.dtype the run uses (resolved from cfg.dtype)
    precision: str | None = None  # what ran, when it is more than `dtype` says (e.g. "bfloat16 autocast, ...")
    # the model the claims were measured on and its weights, for run.json and the report: "gemma-3-270m (trained)"
    model: str | None = None
    flush_every_s: float = 10.0
    # lines the experiment wants read after its claims (e.g. why a claim fails by design on these inputs);
    # printed last and kept in run.json
    notes: list[str] = field(default_factory=list)
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _claims: list[dict[str, Any]] = field(default_factory=list)
    _samples: list[dict[str, Any]] = field(default_factory=list)  # samples.jsonl (core/samples.py)
    _last_flush: float = field(default_factory=time.monotonic)

    # -- metrics ---------------------------------------------------------------------------
    def log(self, metric: str, value: Any, **index: Any) -> None:
        """One measurement; `index` names what identifies it (step=, layer=, dtype=, ...)."""
        row = {"experiment": self.experiment, "run_id": self.run_id, "metric": metric,
               "value": float(_as_scalar(value))}
        row.update({k: _as_scalar(v) for k, v in index.items()})
        self._rows.append(row)
        for sink in _SINKS:
            sink(row)
        if time.monotonic() - self._last_flush > self.flush_every_s:
            self.flush()

    def log_many(self, values: dict[str, Any], **index: Any) -> None:
        for metric, value in values.items():
            self.log(metric, value, **index)

    def metrics(self) -> pd.DataFrame:
        frame = pd.DataFrame(self._rows)
        if frame.empty:
            return pd.DataFrame(columns=METRIC_LEAD_COLUMNS)
        rest = [c for c in frame.columns if c not in METRIC_LEAD_COLUMNS]
        return frame[METRIC_LEAD_COLUMNS + rest]

    # -- claims ----------------------------------------------------------------------------
    def check(self, id: str, ref: str, description: str, measured: Any, comparison: str, tolerance: float,
              paper_value: float | None = None, measure: str | None = None, exact: bool = False) -> bool:
        """Record one claim with a stable id (`paper.figure.what`, the same across runs and presets).

        `measured` must come from a computation independent of the other side of the claim; NaN fails.
        `measure` says what the number is, short (`log10(control L∞ / patched L∞)`): the console prints
        `measure = value` with it. `exact`: an exactness claim (equal up to rounding, bit for bit), which holds on
        any weights, random ones included: `report --strict` never excuses its failure, not even at preset=smoke
        (where a learning claim may fail).
        """
        if not _CLAIM_ID.match(id):
            raise ValueError(f"claim id {id!r} must look like 'paper.figure.what' (lowercase, dots)")
        if comparison not in COMPARISONS:
            raise ValueError(f"comparison {comparison!r} must be one of {COMPARISONS}")
        if comparison == "within" and paper_value is None:
            raise ValueError(f"claim {id}: 'within' needs a paper_value")
        measured = float(_as_scalar(measured))
        tolerance = float(_as_scalar(tolerance))
        if comparison == "<=":
            passed = measured <= tolerance
        elif comparison == ">=":
            passed = measured >= tolerance
        else:
            passed = abs(measured - float(paper_value)) <= tolerance
        passed = bool(passed) and not math.isnan(measured)
        self._claims.append(dict(id=id, ref=ref, description=description,
                                 paper_value=None if paper_value is None else float(paper_value),
                                 measured=measured, tolerance=tolerance, comparison=comparison, passed=passed,
                                 measure=measure or "", exact=bool(exact)))
        progress.note_done(f"claim {id}")  # an interrupt from here on stops "at experiment (after claim ...)"
        return passed

    def claims(self) -> pd.DataFrame:
        return pd.DataFrame(self._claims, columns=CLAIM_COLUMNS)

    # -- samples -----------------------------------------------------------------------------
    def sample(self, record: dict[str, Any]) -> None:
        """One line of samples.jsonl: a generated token as each model saw it (core/samples.token_sample)."""
        self._samples.append(record)

    # -- files -----------------------------------------------------------------------------
    @property
    def figures_dir(self) -> Path:
        return self.run_dir / FIGURES_DIR

    def path(self, name: str) -> Path:
        """A file of this run (for extra artefacts such as a checkpoint)."""
        return self.run_dir / name

    def flush(self) -> None:
        write_csv_atomic(self.run_dir / METRICS_FILE, self.metrics())
        if self._claims:
            write_csv_atomic(self.run_dir / CLAIMS_FILE, self.claims())
        if self._samples:
            from experiments.core.samples import SAMPLES_FILE, write_samples

            write_samples(self.run_dir / SAMPLES_FILE, self._samples)
        self._last_flush = time.monotonic()


# A committed run (results/README.md) keeps a large metrics.csv gzipped beside nothing else: the same table,
# a tenth of the bytes (every row repeats the experiment and run id). Readers take either.
GZIP_SUFFIX = ".gz"


def metrics_path(run_dir: Path) -> Path | None:
    """The run's metrics table, plain or gzipped, or None when it wrote none."""
    for name in (METRICS_FILE, METRICS_FILE + GZIP_SUFFIX):
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    return None


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """metrics.csv (or metrics.csv.gz); a missing, empty or cut-off table is one UserError naming the file."""
    path = metrics_path(run_dir) or Path(run_dir) / METRICS_FILE
    return _read_table(path)


def read_claims(run_dir: Path) -> pd.DataFrame:
    return _read_table(Path(run_dir) / CLAIMS_FILE)


def _read_table(path: Path) -> pd.DataFrame:
    from experiments.core.errors import UserError, first_line

    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, EOFError, OSError) as err:
        raise UserError(f"{path} cannot be read (cut off or damaged?): {first_line(err)}") from None
