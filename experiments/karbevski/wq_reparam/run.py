"""wq_reparam — Karbevski & Mijoski §3-4 and App. 8.2-8.5: every W_Q = I construction, checked.

Setup. Random float64 weights (a small decoder-only transformer: token and position embeddings,
L blocks of causal multi-head attention and a GELU MLP, a head). Each constructive statement builds
the weights its proof writes down, and the original and the reparametrized model run the same
genuine forward pass. Beside each, a control that must fail: the un-adjusted model (W_Q := I and
nothing else), or the construction used where the paper says it does not hold. The obstructions the
paper states (Remark 1: all layers with both skips; Remark 4: a tied head; Remark 7: LayerNorm;
Cor. 8.4.1: no ReLU MLP absorbs a generic skip) are measured, beside the exact construction each is
the failing counterpart of. Errors are max |original − reparametrized| over all outputs, divided by
max |original| (relative), worst over `trials` random draws. Remark 5 (f_M's deviation from
linearity) is measured across d; the parameter count of the reduced model is counted from its tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.atomic import write_text_atomic
from experiments.core.errors import UserError
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.validation import require_positive
from experiments.karbevski import wq_statements as st
from experiments.karbevski.reparam import thm42_attention_skip_only
from experiments.karbevski.toy_transformer import Arch, forward, parameter_counts, random_weights
from experiments.karbevski.wq_reparam import WqReparamConfig

PAPER = "Karbevski & Mijoski"
# (ref for the claim id, what, paper reference, function); exact statements: construction ≈ 0, control ≠ 0.
EXACT = [
    ("lemma3_1", "invariance", "Lemma 3.1", st.lemma31_invariance, {}),
    ("lemma3_1", "query_identity", "Lemma 3.1 (Θ = W_Q)", st.lemma31_query_identity, {}),
    ("prop4_1", "single_head_merge", "Prop. 4.1", st.prop41_single_head, {}),
    ("prop4_2", "block_diagonal", "Prop. 4.2", st.prop42_block_diagonal, {}),
    ("thm4_1", "single_layer_exact", "Thm 4.1", st.thm41_single_layer_elimination, {}),
    ("thm4_1", "single_layer_exact_tied_input", "Thm 4.1, Remark 4 (untied)", st.thm41_single_layer_elimination,
     {"tied": True}),
    ("thm4_2", "all_layers_exact", "Thm 4.2", st.thm42_all_layers, {}),
    ("thm4_2", "all_layers_exact_tied", "Thm 4.2 (tied head)", st.thm42_all_layers, {"tied": True}),
    ("thm4_3", "weight_shared_exact", "Thm 4.3", st.thm43_weight_shared, {}),
    ("lemma8_1", "semi_conjugacy", "Lemma 8.1", st.lemma81_semi_conjugacy, {}),
    ("thm8_2", "layernorm_basis_change", "Thm 8.2 (control: Remark 7 linear fix)", st.thm82_layernorm_basis, {}),
    ("thm8_3", "skip_absorbed", "Thm 8.3", None, {}),
]
# obstructions: the measured error must be visibly non-zero; their pair is the exact counterpart.
OBSTRUCTIONS = [
    ("remark1", "all_layers_both_skips_fails", "Remark 1", st.remark1_both_skips),
    ("remark4", "tied_head_fails", "Remark 4", st.remark4_tied_kept),
    ("remark7", "layernorm_model_fails", "Remark 7, App. 8.2", st.remark7_layernorm_model),
    ("cor8_4_1", "no_fit_generic", "Cor. 8.4.1", None),
]
NANOGPT_SAVED_M = 84.95 - 77.88  # Table 2: non-embedding params, baseline 124M minus W_Q = I 117M


def shape(cfg: WqReparamConfig) -> st.Shape:
    return st.Shape(d_model=cfg.d_model, heads=cfg.heads, layers=cfg.layers, d_ff=cfg.d_ff, vocab=cfg.vocab,
                    seq_len=cfg.seq_len, batch=cfg.batch, ln_eps=cfg.ln_eps, wq_rank=cfg.wq_rank)


def measure(key: str, fn, kwargs: dict, cfg: WqReparamConfig, s: st.Shape, g: torch.Generator) -> dict:
    r = cfg.relu
    if key == "thm8_3":
        return st.thm83_absorb(r.h, r.m, r.j_size, r.samples, g)
    if key == "cor8_4_1":
        return st.cor841_no_fit(r.h, r.m, r.j_size, r.samples, g)
    return fn(s, g, **kwargs)


def run(cfg: WqReparamConfig, ctx: RunContext) -> None:
    g = torch.Generator().manual_seed(cfg.seed)
    s = shape(cfg)
    jobs = [(ref, what, label, fn, kw, "exact") for ref, what, label, fn, kw in EXACT]
    jobs += [(ref, what, label, fn, {}, "obstruction") for ref, what, label, fn in OBSTRUCTIONS]
    results: dict[str, list[dict]] = {}
    with progress(len(jobs) * cfg.trials + 2, "wq_reparam") as bar:
        for ref, what, label, fn, kw, kind in jobs:
            key = f"{ref}.{what}"
            for trial in range(cfg.trials):
                r = measure(ref, fn, kw, cfg, s, g)
                index = dict(statement=key, label=label, kind=kind, trial=trial)
                for role, value in (("construction", r["error"]), ("control", r["control"])):
                    ctx.log("abs_error", value, role=role, **index)
                    ctx.log("rel_error", value / r["scale"], role=role, **index)
                for extra in ("condition", "condition_generic", "error_d_prime_form", "d_tilde_condition"):
                    if extra in r:
                        ctx.log(extra, r[extra], **index)
                results.setdefault(key, []).append(r)
                bar.advance(1, info=key)
        lemma84 = [st.lemma84_independence(cfg.relu.h, cfg.relu.m, cfg.relu.samples, g) for _ in range(cfg.trials)]
        for trial, r in enumerate(lemma84):
            ctx.log("sigma_min_abs_features", r["error"], role="non_collinear", trial=trial)
            ctx.log("sigma_min_abs_features", r["control"], role="collinear_control", trial=trial)
        bar.advance(1, info="lemma8_4")
        k5 = cfg.remark5
        remark5 = st.remark5_deviation(k5.dims, k5.samples_per_dim, k5.eps, k5.scale, g)
        for row in remark5:
            ctx.log("linearity_deviation", row["deviation"], d=row["d"])
            ctx.log("coefficient_cv", row["coefficient_cv"], d=row["d"])
        bar.advance(1, info="remark5")
    counts = log_parameter_counts(ctx, cfg, g)
    check_claims(ctx, cfg, results, lemma84, remark5, counts)


def _meta_model(vocab: int, d: int, d_ff: int, layers: int, max_len: int) -> dict:
    """The shapes of a model without its values (the meta device allocates nothing)."""
    def t(*shape):
        return torch.empty(*shape, device="meta")

    return {"E": t(vocab, d), "E_P": t(max_len, d), "head": None,
            "layers": [{"W_Q": t(d, d), "W_K": t(d, d), "W_V": t(d, d), "W_O": t(d, d),
                        "W_up": t(d, d_ff), "W_down": t(d_ff, d)} for _ in range(layers)]}


# The reduction whose parameters are counted: the one the forward pass shows equal (a test swaps in an
# invalid one, W_Q dropped and nothing adjusted, and the parameter claims must then fail).
REDUCE = thm42_attention_skip_only


def log_parameter_counts(ctx: RunContext, cfg: WqReparamConfig, g: torch.Generator) -> dict:
    """Attention parameters of the toy model and of its Thm 4.2 reduction, counted from the reduced
    tensors, with the reduced model's own forward pass against the original's (relative max error);
    and nanoGPT's GPT-2 small shape reduced by the same function on shape-only (meta) tensors."""
    w = random_weights(cfg.vocab, cfg.d_model, cfg.d_ff, cfg.layers, cfg.seq_len, g)
    reduced = REDUCE(w)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq_len), generator=g)
    arch = Arch(heads=cfg.heads, skips="attention")
    original = forward(tokens, w, arch)
    error = ((forward(tokens, reduced, arch) - original).abs().max() / original.abs().max()).item()
    ctx.log("reduced_model_rel_error", error, model="toy")
    toy = (parameter_counts(w), parameter_counts(reduced))
    n = cfg.nanogpt
    big = _meta_model(n.vocab, n.d_model, 4 * n.d_model, n.layers, n.block_size)
    nano = (parameter_counts(big), parameter_counts(REDUCE(big)))
    for model, (before, after) in (("toy", toy), ("nanogpt", nano)):
        for part in ("attention", "mlp", "total"):
            ctx.log("parameters", before[part], model=model, part=part, architecture="baseline")
            ctx.log("parameters", after[part], model=model, part=part, architecture="wq_identity")
    return {"toy": toy, "nanogpt": nano, "reduced_error": error}


def _worst(results: list[dict], field: str, reduce=max) -> float:
    return reduce(r[field] / r["scale"] for r in results)


def check_claims(ctx: RunContext, cfg: WqReparamConfig, results: dict, lemma84: list, remark5: list,
                 counts: dict) -> None:
    k = cfg.claims
    for ref, what, label, _, _ in EXACT:
        rs = results[f"{ref}.{what}"]
        ctx.check(f"karbevski.{ref}.{what}", f"{PAPER} {label}",
                  f"{label}: worst relative max |original − reparametrized| output over random float64 draws "
                  "(genuine forward pass of the constructed weights)", _worst(rs, "error"), "<=", k.exact_tolerance,
                  measure="worst relative max |original − reparametrized|")
        ctx.check(f"karbevski.{ref}.{what}_control_differs", f"{PAPER} {label}",
                  f"{label}: the control (un-adjusted weights, or the construction where it does not apply) "
                  "differs from the original: smallest relative error over draws", _worst(rs, "control", min),
                  ">=", k.control_min, measure="smallest relative max |original − control|")
    for ref, what, label, _ in OBSTRUCTIONS:
        rs = results[f"{ref}.{what}"]
        ctx.check(f"karbevski.{ref}.{what}", f"{PAPER} {label}",
                  f"{label}: the obstruction the paper states is measured: smallest relative error over draws "
                  "of the attempted reparametrization", _worst(rs, "error", min), ">=", k.control_min,
                  measure="smallest relative max |original − attempted|")
        ctx.check(f"karbevski.{ref}.{what}_counterpart_exact", f"{PAPER} {label}",
                  f"{label}: the exact counterpart (same recipe where the paper says it holds): worst relative "
                  "error over draws", _worst(rs, "control"), "<=", k.exact_tolerance,
                  measure="worst relative max |original − counterpart|")
    r83 = results["thm8_3.skip_absorbed"]
    ctx.check("karbevski.thm8_3.condition_fails_generically", f"{PAPER} Thm 8.3, Cor. 8.4.1",
              "generic Gaussian (W₁, W₂): smallest max|W₂[:,J]W₁[J,:] + I| over every index set J with |J| ≥ h",
              min(r["condition_generic"] for r in r83), ">=", k.control_min)
    ctx.check("karbevski.lemma8_4.abs_features_independent", f"{PAPER} Lemma 8.4",
              "pairwise non-collinear rows: smallest singular value of the unit-normalized |w_iᵀx| feature "
              "matrix (0 iff dependent), worst draw", min(r["error"] for r in lemma84), ">=", k.control_min)
    ctx.check("karbevski.lemma8_4.collinear_control_dependent", f"{PAPER} Lemma 8.4",
              "control with two collinear rows: the same smallest singular value, largest over draws",
              max(r["control"] for r in lemma84), "<=", k.exact_tolerance)
    dims = np.array([r["d"] for r in remark5], dtype=float)
    dev = np.array([r["deviation"] for r in remark5])
    slope = float(np.polyfit(np.log(dims), np.log(dev), 1)[0]) if len(dims) > 1 else math.nan
    ctx.log("linearity_deviation_slope", slope)
    ctx.check("karbevski.remark5.linearity_improves_with_d", f"{PAPER} Remark 5",
              "log-log slope of f_M's relative deviation from its best linear fit (held-out) against d",
              slope, "<=", k.remark5_slope_max)
    # A saving counts only for a reduction that keeps the model's function: where the reduced model's forward
    # pass is not the original's (relative error above exact_tolerance), nothing was saved (0).
    exact = counts["reduced_error"] <= k.exact_tolerance
    before, after = counts["toy"]
    ctx.check("karbevski.sec3_1.attention_params_saved", f"{PAPER} §3.1",
              "fraction of attention parameters removed by the Thm 4.2 reduction, counted from the tensors of the "
              "reduced model whose forward pass equals the original's (0 when it does not)",
              (1 - after["attention"] / before["attention"]) if exact else 0.0, "within", 1e-12, paper_value=0.25,
              measure="1 − attention params reduced / original (0 unless the reduced forward is exact)")
    before, after = counts["nanogpt"]
    ctx.check("karbevski.table2.params_saved_millions", f"{PAPER} Table 2, §5.1",
              "parameters removed at nanoGPT's GPT-2 small shape (millions) by the same reduction, counted from "
              "its tensor shapes (0 unless that reduction is exact on the toy model), vs the difference of "
              "Table 2's non-embedding counts (baseline 124M minus W_Q = I 117M)",
              (before["total"] - after["total"]) / 1e6 if exact else 0.0, "within", 0.01,
              paper_value=NANOGPT_SAVED_M, measure="params removed, millions (0 unless the reduction is exact)")


# -- figure ------------------------------------------------------------------------------------

def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(3, width=3.9, height=4.6)
    ax_err, ax_lin, ax_par = axes[0]
    rel = metric(metrics, "rel_error")
    # the worst draw for the claim: the largest error of what should be exact, the smallest of what must fail
    should_be_exact = (rel["kind"] == "exact") == (rel["role"] == "construction")
    keys = ["statement", "label", "kind", "role"]
    worst = pd.concat([rel[should_be_exact].groupby(keys, as_index=False)["value"].max(),
                       rel[~should_be_exact].groupby(keys, as_index=False)["value"].min()])
    order = [f"{r}.{w}" for r, w, *_ in EXACT] + [f"{r}.{w}" for r, w, *_ in OBSTRUCTIONS]
    order = [o for o in order if o in set(worst["statement"])]
    floor = 1e-17  # exact zeros drawn at the left edge of the log axis
    for i, key in enumerate(order):
        rows = worst[worst["statement"] == key].set_index("role")["value"]
        exact = worst[worst["statement"] == key]["kind"].iloc[0] == "exact"
        built, other = rows.get("construction", np.nan), rows.get("control", np.nan)
        y = len(order) - 1 - i
        if exact:
            ax_err.plot(max(built, floor), y, "o", color="C0", label="construction" if i == 0 else None)
            ax_err.plot(max(other, floor), y, "x", color="C3", ms=7, label="control (must fail)" if i == 0 else None)
        else:
            first = key == order[len(EXACT)] if len(order) > len(EXACT) else False
            ax_err.plot(max(built, floor), y, "^", color="C1", label="obstruction (measured)" if first else None)
            ax_err.plot(max(other, floor), y, "s", color="C2", mfc="none",
                        label="its exact counterpart" if first else None)
    labels = {row.statement: row.label for row in worst.itertuples()}
    ax_err.set_yticks(range(len(order)), [labels[k] for k in reversed(order)], fontsize=6.5)
    ax_err.axvline(1e-10, color="k", ls="--", lw=0.8, label="exactness bound 1e-10")
    ax_err.axvline(np.finfo(np.float64).eps, color="grey", ls=":", lw=0.8, label="float64 eps")
    ax_err.set(xscale="log", xlabel="relative max |original − reparametrized| (worst draw)",
               title="Each statement vs its control (float64)")
    ax_err.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.4, -0.13), ncol=2)

    dev, cv = metric(metrics, "linearity_deviation"), metric(metrics, "coefficient_cv")
    if not dev.empty:
        d = dev.groupby("d", as_index=False)["value"].mean()
        ax_lin.plot(d["d"], d["value"], "o-", color="C0", label="deviation of f_M from best linear fit")
        c = cv.groupby("d", as_index=False)["value"].mean()
        ax_lin.plot(c["d"], c["value"], "s--", color="C1", label="coef. of variation of its scalar factor")
        ax_lin.plot(d["d"], d["value"].iloc[0] * (d["d"] / d["d"].iloc[0]) ** -0.5, color="grey", lw=0.8,
                    ls=":", label=r"$\propto d^{-1/2}$")
        ax_lin.set(xscale="log", yscale="log", xlabel="d", ylabel="relative deviation (held-out)",
                   title=r"Remark 5: $f_M = L_\varepsilon^{-1} M_0 L_\varepsilon$ vs its best linear fit")
        ax_lin.set_xticks(d["d"], [str(int(v)) for v in d["d"]], fontsize=6.5)
        ax_lin.minorticks_off()
        ax_lin.legend(fontsize=6.5)

    par = metric(metrics, "parameters")
    if not par.empty:
        nano = par[(par["model"] == "nanogpt")].pivot_table(index="part", columns="architecture", values="value")
        parts = ["attention", "mlp", "total"]
        x = np.arange(len(parts))
        for j, arch in enumerate(("baseline", "wq_identity")):
            vals = [nano.loc[p, arch] / 1e6 for p in parts]
            ax_par.bar(x + (j - 0.5) * 0.38, vals, width=0.38, color=f"C{j}",
                       label="baseline" if arch == "baseline" else r"$W_Q = I$")
        for xi, p in zip(x, parts, strict=True):
            if p == "mlp":
                continue  # unchanged
            saved = 1 - nano.loc[p, "wq_identity"] / nano.loc[p, "baseline"]
            ax_par.annotate(f"−{100 * saved:.1f}%", (xi, nano.loc[p, "baseline"] / 1e6), ha="center",
                            va="bottom", fontsize=7)
        ax_par.set_xticks(x, ["attention", "MLP", "all blocks\n+ embeddings"])
        ax_par.set(ylabel="parameters (millions)", title="nanoGPT shape (d 768, 12 layers, tied head)")
        ax_par.legend(fontsize=6.5)
    return save_figure(fig, figures_dir, "wq_reparam") + [write_table(worst, order, figures_dir)]


def write_table(worst: pd.DataFrame, order: list[str], figures_dir: Path) -> Path:
    """The figure's numbers as a markdown table (figures/wq_reparam_table.md), from metrics alone."""
    lines = ["| statement | kind | construction (rel. max error) | control / counterpart |", "|---|---|---|---|"]
    for key in order:
        rows = worst[worst["statement"] == key]
        by_role = rows.set_index("role")["value"]
        lines.append(f"| {rows['label'].iloc[0]} | {rows['kind'].iloc[0]} | {by_role.get('construction', np.nan):.2e} "
                     f"| {by_role.get('control', np.nan):.2e} |")
    path = Path(figures_dir) / "wq_reparam_table.md"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def validate(cfg: WqReparamConfig) -> None:
    require_positive(cfg, "d_model", "heads", "layers", "d_ff", "vocab", "seq_len", "batch", "trials",
                     "relu.samples", "remark5.samples_per_dim")
    if cfg.d_model % cfg.heads:
        raise UserError(f"d_model={cfg.d_model} is not divisible by heads={cfg.heads}")
    if cfg.wq_rank is not None and not 0 <= cfg.wq_rank <= cfg.d_model:
        raise UserError(f"wq_rank={cfg.wq_rank} must lie in [0, d_model={cfg.d_model}]")
    if cfg.wq_rank is not None and cfg.wq_rank < cfg.d_model:
        raise UserError(f"wq_rank={cfg.wq_rank} < d_model={cfg.d_model} makes every W_Q singular: the W_Q = I "
                        "reparametrization needs W_Q in GL(d) (invertible); use wq_rank=null")
    r = cfg.relu
    if not 2 <= r.h <= r.j_size <= r.m:
        raise UserError(f"relu: need 2 ≤ h ≤ j_size ≤ m (Thm 8.3: |J| ≥ h, m ≥ h ≥ 2); got h={r.h}, "
                        f"j_size={r.j_size}, m={r.m}")
    if r.m > 14:
        raise UserError(f"relu.m={r.m}: the no-fit search enumerates 2^m sign patterns; keep m ≤ 14")
    if any(d < 3 for d in cfg.remark5.dims):
        raise UserError("remark5.dims must all be at least 3 (LayerNorm's zero-mean subspace has dimension d − 1)")
