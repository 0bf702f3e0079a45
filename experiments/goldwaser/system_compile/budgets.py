"""The budget points each method is compiled at, and the choice among them.

A method's points are the product of its grid keys (analytic: `analytic_ranks` × `ridges`; bake: `bake_ranks` ×
`bake_steps`), each empty list standing for the single key (`analytic_rank`, `ridge`, `rank`, `steps`). With more
than one point the choice is made on a VALIDATION split, the last `validation` fit queries, which no point is
fitted on: each point is compiled on the other fit queries and scored by its mean next-token KL along the
prompted model's replies to the validation queries; the lowest wins (a tie goes to the faster compile). The
chosen point is then compiled again on every fit query and is the only one measured on the held-out queries:
they choose nothing and are touched once."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from experiments.core.errors import UserError
from experiments.goldwaser.system_compile.schema import SystemCompileConfig


@dataclass(frozen=True)
class Point:
    """One budget: for the analytic patch its rank (None: as least squares gives it) and ridge; for the bake its
    LoRA rank and step count."""

    method: str
    rank: int | None
    ridge: float | None = None
    steps: int | None = None

    def columns(self) -> dict[str, float]:
        """The point as metrics.csv columns (NaN where the method has no such knob; rank NaN: full)."""
        nan = math.nan
        return dict(budget_rank=nan if self.rank is None else float(self.rank),
                    budget_ridge=nan if self.ridge is None else float(self.ridge),
                    budget_steps=nan if self.steps is None else float(self.steps))

    def label(self) -> str:
        if self.method == "analytic":
            return f"rank {'full' if self.rank is None else self.rank}, ridge {self.ridge:g}"
        return f"rank {self.rank}, {self.steps} steps"


def _values(cfg: SystemCompileConfig, grid: str, single: str) -> list:
    return list(getattr(cfg, grid)) or [getattr(cfg, single)]


def points(cfg: SystemCompileConfig, method: str) -> list[Point]:
    """The method's budget points, in the order the grid keys give them."""
    if method == "analytic":
        return [Point("analytic", r, ridge=x)
                for r, x in itertools.product(_values(cfg, "analytic_ranks", "analytic_rank"),
                                              _values(cfg, "ridges", "ridge"))]
    return [Point("bake", r, steps=s)
            for r, s in itertools.product(_values(cfg, "bake_ranks", "rank"), _values(cfg, "bake_steps", "steps"))]


def check_budgets(cfg: SystemCompileConfig, methods: list[str], fit_queries: int) -> None:
    """One line each, before any model is loaded: a grid's values, and a choice with nothing to choose on."""
    validation = cfg.validation
    if validation < 0:
        raise UserError(f"validation={validation} must be 0 (no choice to make) or a number of fit queries")
    if validation and validation >= fit_queries:
        raise UserError(f"validation={validation} leaves no fit query to compile on ({fit_queries} fit queries; "
                        f"validation ≤ {fit_queries - 1})")
    for key in ("analytic_ranks", "bake_ranks", "bake_steps"):
        values = list(getattr(cfg, key))
        if any(v is not None and v < 1 for v in values):
            raise UserError(f"{key}={values} must hold positive integers"
                            + (" (null: the full least-squares rank)" if key == "analytic_ranks" else ""))
    if any(x < 0 for x in cfg.ridges):
        raise UserError(f"ridges={list(cfg.ridges)} must be 0 (the least-squares lemma) or more")
    for method in methods:
        many = points(cfg, method)
        if len(many) > 1 and not validation:
            raise UserError(f"{len(many)} budget points for {method} need validation=N (the last N fit queries, "
                            "not fitted on, choose among them): the held-out queries never choose")
        if len(set(many)) != len(many):
            raise UserError(f"{method}'s budget points repeat one another: {', '.join(p.label() for p in many)}")


def choose(scored: list[tuple[Point, float, float]]) -> Point:
    """The point of lowest validation KL, a tie going to the faster compile (a diverged one, KL NaN, last):
    (point, KL, seconds) each."""
    return min(scored, key=lambda s: (s[1] if math.isfinite(s[1]) else math.inf, s[2]))[0]
