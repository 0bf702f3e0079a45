"""A figure file that exists can still be blank: check that something was drawn on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import image


def assert_drawn(png: Path, min_ink: float = 0.02, min_colors: int = 8) -> None:
    """At least `min_ink` of the pixels differ from the background and there are several colours
    (axes alone, or an empty panel grid, fail: curves, bands and heat maps add colours)."""
    pixels = image.imread(png)[..., :3]
    background = np.median(pixels.reshape(-1, 3), axis=0)
    ink = (np.abs(pixels - background).sum(-1) > 0.05).mean()
    levels = (pixels * 15).round().astype(np.int64)  # 16 levels a channel, one integer a colour: a 1-D unique
    colors = len(np.unique(levels[..., 0] * 256 + levels[..., 1] * 16 + levels[..., 2]))
    assert ink >= min_ink, f"{png.name}: only {ink:.1%} of the pixels are drawn"
    assert colors >= min_colors, f"{png.name}: {colors} colours, looks like empty axes"
