"""Figures from CSVs alone: the same code renders them at the end of a run and in `icl-exp plot`.

Every figure is saved as PNG (for a quick look) and PDF (for a paper), atomically.
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.core.atomic import write_atomic  # noqa: E402

log = logging.getLogger(__name__)
# matplotlib logs at INFO ("Substituting symbol E from STIXNonUnicode" for each mathtext glyph), and a
# run's logging passes INFO through: only its warnings reach the console.
logging.getLogger("matplotlib").setLevel(logging.WARNING)

PAPER_STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 160,
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def new_figure(ncols: int, nrows: int = 1, width: float = 3.6, height: float = 3.0, **kw):
    plt.rcParams.update(PAPER_STYLE)
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def save_figure(fig, figures_dir: Path, name: str) -> list[Path]:
    """Write figures_dir/name.png and .pdf; close the figure."""
    figures_dir = Path(figures_dir)
    paths = []
    fig.tight_layout()
    for ext in ("png", "pdf"):
        path = figures_dir / f"{name}.{ext}"
        write_atomic(path, lambda p, ext=ext: fig.savefig(p, format=ext, bbox_inches="tight"))
        paths.append(path)
    plt.close(fig)
    log.info("figure %s", figures_dir / f"{name}.png")
    return paths


def metric(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows of one metric, with the columns that are all-NaN for it dropped."""
    return frame[frame["metric"] == name].dropna(axis=1, how="all")


def mean_sem(frame: pd.DataFrame, by: str | list[str], value: str = "value") -> pd.DataFrame:
    """Mean and standard error of `value` grouped by `by` (sem = 0 for single samples)."""
    g = frame.groupby(by)[value]
    out = g.agg(["mean", "std", "count"]).reset_index()
    out["sem"] = (out["std"] / out["count"].clip(lower=1) ** 0.5).fillna(0.0)
    return out
