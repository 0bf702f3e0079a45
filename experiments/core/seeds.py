"""A sweep over seeds, one row per claim: `-m seed=0,1,2` gives three jobs that differ only by `seed`; their
claims fold into one row each: passed on n_passed of n_seeds seeds, the mean of `measured` and its 95 %
interval (Student's t over the seeds). A claim passes when it passes on every seed, unless the experiment
declares a quorum (`Experiment.seed_quorum`, the fraction of seeds it must pass on); none does today: a
claim of the papers is a statement about every trained model, not about most of them.
"""

from __future__ import annotations

import math

import pandas as pd

from experiments.core.results import CLAIM_COLUMNS

# two-sided 95 % quantiles of Student's t by degrees of freedom (n_seeds - 1); the normal 1.96 beyond 30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
SEED_COLUMNS = ["n_passed", "n_seeds", "measured_lo", "measured_hi", "seeds"]


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def interval95(values: list[float]) -> tuple[float, float, float]:
    """The mean and the 95 % interval of the mean (t over n - 1 degrees of freedom); NaN values count as
    what they are (a claim measured NaN fails and its mean is NaN)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def seeds_only(overrides: list[list[str]]) -> bool:
    """Do these jobs' overrides differ only by `seed=` (and are there two jobs or more)?"""
    if len(overrides) < 2:
        return False
    rest = [sorted(o for o in job if not o.startswith("seed=")) for job in overrides]
    seeds = [[o for o in job if o.startswith("seed=")] for job in overrides]
    return all(r == rest[0] for r in rest) and len({tuple(s) for s in seeds}) == len(seeds)


def aggregate_claims(claims: pd.DataFrame, seeds: dict[str, object], quorum: float = 1.0) -> pd.DataFrame:
    """One row per claim id from the jobs' rows (`job` first, as a sweep combines them): `measured` is the
    mean, `measured_lo`/`measured_hi` its 95 % interval, `passed` whether it passed on at least `quorum` of
    the seeds (every seed by default), `n_passed`/`n_seeds` the count, `seeds` which seeds."""
    rows = []
    for _, group in claims.groupby("id", sort=False):
        row = {c: group.iloc[0][c] for c in CLAIM_COLUMNS if c in group.columns}
        values = [float(v) for v in pd.to_numeric(group["measured"], errors="coerce")]
        passed = group["passed"].astype(str) == "True"
        mean, lo, hi = interval95(values)
        n, n_passed = len(group), int(passed.sum())
        row.update(measured=mean, passed=n_passed >= math.ceil(quorum * n - 1e-9), n_passed=n_passed, n_seeds=n,
                   measured_lo=lo, measured_hi=hi, seeds=",".join(str(seeds.get(str(j), j)) for j in group["job"]))
        rows.append(row)
    columns = [c for c in CLAIM_COLUMNS if c in claims.columns] + SEED_COLUMNS
    return pd.DataFrame(rows, columns=columns)


def _margin(measured, row) -> float:
    """A value in tolerances: <= 1 passes for `<=`, >= 1 for `>=`, within ±1 for `within` (signed, so that
    an interval stays an interval)."""
    tol = float(row["tolerance"])
    if row["comparison"] == "within":
        return (float(measured) - float(row["paper_value"])) / tol if tol else math.nan
    return float(measured) / tol if tol else math.nan


FIGURE = "claims_over_seeds"


def plot_claims_over_seeds(by_job: pd.DataFrame, over_seeds: pd.DataFrame, figures_dir) -> list:
    """The combined figure of a seed sweep: per claim, each seed's value and the mean with its 95 % band,
    in units of the claim's tolerance (the line at 1 is where it would flip), so claims of every scale
    share one axis."""
    from experiments.core.plotting import new_figure, save_figure

    n = len(over_seeds)
    if n == 0:
        return []
    fig, axes = new_figure(1, width=6.4, height=0.45 * n + 1.2)
    ax = axes[0][0]
    for i, row in enumerate(over_seeds.to_dict("records")):
        values = [_margin(v, row) for v in by_job.loc[by_job["id"] == row["id"], "measured"]]
        lo, hi = sorted((_margin(row["measured_lo"], row), _margin(row["measured_hi"], row)))
        colour = "tab:green" if row["passed"] else "tab:red"
        ax.fill_betweenx([i - 0.3, i + 0.3], lo, hi, color=colour, alpha=0.25, lw=0)
        ax.plot([_margin(row["measured"], row)] * 2, [i - 0.3, i + 0.3], color=colour, lw=2)
        ax.plot(values, [i] * len(values), "o", color="black", ms=3)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    if (over_seeds["comparison"] == "within").any():
        ax.axvline(-1.0, color="grey", ls="--", lw=1)
    ax.set_yticks(range(n), [f"{r['id']} ({r['n_passed']}/{r['n_seeds']})" for r in over_seeds.to_dict("records")],
                  fontsize=7)
    ax.set_xscale("symlog", linthresh=1e-2)
    ax.set_xlabel("measured / tolerance ((measured − paper) / tolerance for `within`); ±1: the threshold")
    ax.set_title("claims over seeds: each seed (dots), the mean and its 95 % interval (band)", fontsize=8)
    return save_figure(fig, figures_dir, FIGURE)
