"""The comparisons Karbevski & Mijoski draw from Table 2 (§5.1 Results 1–3), as functions of the final
validation losses, so a single job (variant=all) records them as claims and a sweep's combined table
reports them, computed the same way."""

from __future__ import annotations

from experiments.karbevski.gpt.variants import VARIANTS

PAPER_REF = "Karbevski & Mijoski §5.1, Table 2"
PAPER_LOSS = {name: v.paper_val_loss for name, v in VARIANTS.items()}  # validation loss at 100k steps


def paper_comparisons(final: dict[str, float]) -> list[dict]:
    """One row per comparison: id, description, measured, comparison, tolerance, paper_value. Rows whose
    variants are missing from `final` are left out."""
    rows = []

    def add(needed, id, description, measure, comparison, tolerance, paper):
        if all(n in final for n in needed):
            rows.append(dict(id=id, ref=PAPER_REF, description=description, measured=measure(final),
                             comparison=comparison, tolerance=tolerance, paper_value=paper(PAPER_LOSS)))

    add(("wq_identity_117m", "baseline_124m"), "karbevski.table2.wq_identity_matches_baseline",
        "W_Q = I (117M) validation loss within 0.01 of the full 124M baseline's (|difference|)",
        lambda f: abs(f["wq_identity_117m"] - f["baseline_124m"]), "<=", 0.01,
        lambda p: abs(p["wq_identity_117m"] - p["baseline_124m"]))
    for other, what in (("baseline_small_mlp", "smaller-MLP"), ("baseline_small_d", "smaller-d_model")):
        add(("wq_identity_117m", other), f"karbevski.table2.wq_identity_beats_{other}",
            f"W_Q = I (117M) reaches a lower validation loss than the parameter-matched {what} baseline "
            f"(baseline minus W_Q = I)",
            lambda f, o=other: f[o] - f["wq_identity_117m"], ">=", 0.0,
            lambda p, o=other: p[o] - p["wq_identity_117m"])
    others = ("baseline_small_mlp", "baseline_small_d", "wq_identity_117m", "baseline_124m")
    add((*others, "wq_identity_large_mlp"), "karbevski.table2.large_mlp_best",
        "W_Q = I with the larger MLP has the best validation loss of the five (next best minus it)",
        lambda f: min(f[o] for o in others) - f["wq_identity_large_mlp"], ">=", 0.0,
        lambda p: min(p[o] for o in others) - p["wq_identity_large_mlp"])
    return rows

