"""Figures from CSVs alone: the same code renders them at the end of a run and in `icl-exp plot`.

Every figure is saved as PNG (for a quick look) and PDF (for a paper), atomically.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import LogFormatter, LogFormatterSciNotation  # noqa: E402

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


# What every figure saved while it is set says at its top: the experiment, model, preset (a title),
# and a warning when the run did not complete (see experiments.core.figures); and, in the PNG's metadata
# (a text chunk under SOURCE_KEY), the table it was drawn from: docs/figures is checked against results/ by it.
_caption: dict[str, str | None] = {"title": None, "warning": None, "source": None}
SOURCE_KEY = "icl-exp source"


@contextmanager
def figure_caption(title: str | None, warning: str | None = None, source: str | None = None) -> Iterator[None]:
    before = dict(_caption)
    _caption.update(title=title, warning=warning, source=source)
    try:
        yield
    finally:
        _caption.update(before)


class PlainLogFormatter(LogFormatter):
    """Log-axis labels as plain numbers (0.9, 1.25, 1e-05), not 9×10⁻¹: matplotlib's choice of which
    ticks get a label is kept."""

    def _num_to_string(self, x, vmin, vmax):
        if 1 <= abs(x) < 1e6 and float(x).is_integer():
            return f"{int(x)}"  # 1000, not 1e+03
        return f"{x:.3g}"


def _readable_log_ticks(fig) -> None:
    """Every log axis still on matplotlib's default (scientific) formatter gets plain labels."""
    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale != "log":
                continue
            if type(axis.get_major_formatter()) is LogFormatterSciNotation:
                axis.set_major_formatter(PlainLogFormatter())
            if type(axis.get_minor_formatter()) is LogFormatterSciNotation:
                axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def _stamp(fig) -> None:
    title, warning = _caption["title"], _caption["warning"]
    if warning:
        fig.suptitle(f"{title}\n{warning}" if title else warning, fontsize=9, color="C3")
    elif title:
        fig.suptitle(title, fontsize=9)


def new_figure(ncols: int, nrows: int = 1, width: float = 3.6, height: float = 3.0, **kw):
    plt.rcParams.update(PAPER_STYLE)
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)


def save_figure(fig, figures_dir: Path, name: str) -> list[Path]:
    """Write figures_dir/name.png and .pdf; close the figure."""
    figures_dir = Path(figures_dir)
    paths = []
    _readable_log_ticks(fig)
    _stamp(fig)
    with warnings.catch_warnings():
        # a generated token in a script the font lacks (Hangul, CJK) is drawn as a box: no console line per glyph
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.tight_layout()
        for ext in ("png", "pdf"):
            path = figures_dir / f"{name}.{ext}"
            # PNG text chunks only (a PDF's would need its own keys); none when no source is known
            meta = {SOURCE_KEY: _caption["source"]} if ext == "png" and _caption["source"] else None
            write_atomic(path, lambda p, ext=ext, meta=meta: fig.savefig(p, format=ext, bbox_inches="tight",
                                                                         metadata=meta))
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


def mean_band(ax, agg: pd.DataFrame, x: str, *, half="sem", scale: float = 1.0, band: bool = True,
              band_alpha: float = 0.2, **line):
    """Draw agg["mean"] against agg[x] (matplotlib `line` keywords) and shade mean ± scale·half around it.

    The one place the error band is drawn, so that every figure's band means what its caption says and
    looks alike: the curve's colour, translucent, no edge. `half` is a column of `agg` (the s.e.m. from
    mean_sem by default; "std" for a spread) or values aligned with its rows; `band=False` draws the
    curve alone (a control that needs no band)."""
    ax.plot(agg[x], agg["mean"], **line)
    if band:
        width = scale * (agg[half] if isinstance(half, str) else half)
        ax.fill_between(agg[x], agg["mean"] - width, agg["mean"] + width, color=line.get("color"),
                        alpha=band_alpha, lw=0)
