"""Rates on log-log axes: geometric grids and least-squares slopes."""

from __future__ import annotations

import numpy as np


def geometric_grid(stop: int, points: int, start: int = 1) -> np.ndarray:
    """About `points` distinct integers from start to stop (both included), evenly spaced in log."""
    grid = np.unique(np.round(np.geomspace(start, stop, points)).astype(int))
    return grid[(grid >= start) & (grid <= stop)]


def loglog_fit(x, y) -> tuple[float, float]:
    """Least-squares fit of log y = slope · log x + intercept; returns (slope, exp(intercept)),
    so y ≈ constant · x^slope."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    slope, intercept = np.polyfit(lx, ly, 1)
    return float(slope), float(np.exp(intercept))


def log_binned_means(x, y, bins_per_decade: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Means of y over geometric bins of x (for per-position curves too noisy to fit point by point);
    each bin is placed at the geometric mean of its x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    edges = np.geomspace(x.min(), x.max() * (1 + 1e-9), max(2, int(np.log10(x.max() / x.min()) * bins_per_decade) + 1))
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    xs, ys = [], []
    for b in np.unique(idx):
        sel = idx == b
        xs.append(np.exp(np.log(x[sel]).mean()))
        ys.append(y[sel].mean())
    return np.array(xs), np.array(ys)
