"""docs/models.md's per-layer table of a committed layer_errors run (report/quoted.py's `table:` marker), from
its metrics.csv alone: per layer, the median over tokens of the patched pass's relative hidden error for the
open loop in float32 and float64 and the closed loop in float32, and the geometric mean over tokens of the
patched layer's gain over the original layer's (float64, the open loop); under it, the gain ratio's range over
every token and layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.core.errors import UserError
from experiments.goldwaser.schema import PatchVariant

# Algorithm 1 (the open loop) in both dtypes and the closed loop in float32; the gain of the float64 open loop
COLUMNS = ((PatchVariant.naive, "float32"), (PatchVariant.naive, "float64"), (PatchVariant.closed_loop, "float32"))
GAIN = (PatchVariant.naive, "float64")


def _metrics(folders: list[Path]) -> pd.DataFrame:
    from experiments.core.results import read_metrics

    if len(folders) != 1:
        raise UserError(f"the per-layer table reads one layer_errors run, not {len(folders)}")
    return read_metrics(Path(folders[0]))


def _rows(m: pd.DataFrame, metric: str, variant: str, dtype: str) -> pd.DataFrame:
    rows = m[(m["metric"] == metric) & (m["variant"] == variant) & (m["dtype"] == dtype) & m["layer"].notna()]
    if rows.empty:
        raise UserError(f"the per-layer table: no {metric} rows for {variant} in {dtype}")
    return rows


def gain_ratio(m: pd.DataFrame, variant: str = GAIN[0], dtype: str = GAIN[1]) -> pd.Series:
    """The patched layer's gain over the original layer's, per (layer, token)."""
    keys = ["layer", "token"]
    patched = _rows(m, "gain_patched", variant, dtype).set_index(keys)["value"].astype(float)
    original = _rows(m, "gain_original", variant, dtype).set_index(keys)["value"].astype(float)
    return (patched / original).dropna()


def layer_table(folders: list[Path]) -> str:
    m = _metrics(folders)
    hidden = {key: _rows(m, "hidden_rel", *key).groupby("layer")["value"].median() for key in COLUMNS}
    ratio = gain_ratio(m)
    geomean = np.exp(np.log(ratio).groupby(level="layer").mean())
    head = ["layer", *(f"{v} {d}" for v, d in COLUMNS), f"patched/original gain ({GAIN[1]})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for layer in sorted(hidden[COLUMNS[0]].index):
        cells = [str(int(layer)), *(f"{hidden[key].get(layer, float('nan')):.1e}" for key in COLUMNS),
                 f"{geomean.get(layer, float('nan')):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    worst = float(np.log10(ratio).groupby(level="layer").median().abs().max())
    lines += ["", f"(The gain ratio over every token and layer, {GAIN[0]} in {GAIN[1]}: {ratio.min():.2f}–"
                  f"{ratio.max():.2f}×, geometric mean {float(np.exp(np.log(ratio).mean())):.3f}×; the worst layer's "
                  f"median 10^{worst:.3f} from 1.)"]
    return "\n".join(lines)
