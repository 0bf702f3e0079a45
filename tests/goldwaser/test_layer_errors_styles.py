"""layer_errors' figure takes each variant's colour, marker and legend entry from the variant registry
(patching/variants.py), and draws a variant the registry does not know (an old run's) in the default style
under its own name: never dropped."""

from __future__ import annotations

import pandas as pd

from experiments.goldwaser.layer_errors import plots
from experiments.patching.variants import DEFAULT_STYLE, VARIANTS


def _metrics(variants) -> pd.DataFrame:
    rows = [dict(metric=metric, value=1e-6 * (layer + 1), dtype="float64", variant=v, prompt=0, token="a",
                 layer=layer, model="tiny-gemma3")
            for v in variants for layer in range(3) for metric in ("hidden_rel", "dm_linf", "control_hidden_rel")]
    return pd.DataFrame(rows)


def test_every_variant_is_drawn_in_its_own_style_and_an_unknown_one_in_the_default(tmp_path, monkeypatch):
    drawn = {}

    def keep(fig, figures_dir, name):
        drawn["fig"] = fig
        return []

    monkeypatch.setattr(plots, "save_figure", keep)
    plots.plot(_metrics(["naive", "mystery"]), tmp_path)
    first = drawn["fig"].axes[0]
    lines = {line.get_label(): line for line in first.get_lines()}
    assert VARIANTS["naive"].label in lines and "mystery" in lines
    assert lines[VARIANTS["naive"].label].get_color() == VARIANTS["naive"].style.color
    assert lines["mystery"].get_color() == DEFAULT_STYLE.color
    assert "mystery" in [t.get_text() for t in first.get_legend().get_texts()]
