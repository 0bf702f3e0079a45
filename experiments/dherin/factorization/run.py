"""factorization — Dherin et al. App. E (Remark 3.2, Corollary E.0.1, Eqs. 27–31).

Setup. Take linreg_icl's trained block (trained in the run, or checkpoint=PATH) and 100 fresh
tasks. Consume each prompt's context one token at a time from the front (Eq. 27):
W_i = W_{i−1} + (W_{i−1} ΔA(c_i)) S_iᵀ / ‖S_i‖², S_i = A(c_{i+1}..c_n, x), ΔA(c_i) = S_{i−1} − S_i.
At every i check Eq. 28 by a forward pass of the patched weights on the remaining tokens:
Φ_{W_i}(c_{i+1}..c_n, x) = Φ_{W_0}(c_1..c_n, x); and check the product form (Eqs. 29–31)
W_i = W_0 (I + h_1 A_1) ⋯ (I + h_i A_i), in particular at i = n. Report the max error per i, in
the run's dtype and in float64. Controls: the unpatched model on the remaining tokens, and the
product with its factors in reverse order (the factors do not commute). Both Eq. 28 and Eq. 31 are
judged by genuine forward passes of the changed weights against the model's forward pass with the
whole context: comparing the product with the recursion would only check associativity.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from experiments.core.errors import UserError
from experiments.core.plotting import mean_band, mean_sem, metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import (
    factor_matrices,
    factor_products,
    factorized_weights,
    increment_norms,
    suffix_contextual_outputs,
)
from experiments.dherin.factorization import FactorizationConfig
from experiments.dherin.models.linreg import ContextualBlock
from experiments.dherin.patched_forward import W_NAME, forward_with
from experiments.dherin.pretrained import pretrained_block, validate_checkpoint
from experiments.patching.rank1 import context_patch

SOURCE = "Dherin App E"


def reversed_products(W0: Tensor, factors: Tensor) -> Tensor:
    """The control: W_0 (I + h_i A_i) ⋯ (I + h_1 A_1), the same factors in reverse order; (B, n+1, m, d)."""
    Q = torch.eye(factors.shape[-1], dtype=factors.dtype, device=factors.device).expand_as(factors[:, 0])
    out = [W0.expand(factors.shape[0], *W0.shape)]
    for i in range(factors.shape[1]):
        Q = factors[:, i] @ Q
        out.append(W0 @ Q)
    return torch.stack(out, dim=1)


@torch.no_grad()
def factorization_errors(model: ContextualBlock, tokens: Tensor, a_suffix: Tensor | None = None) -> dict[str, Tensor]:
    """Per i = 0..n (max over tasks and entries), each claim's two sides from independent computations:
    - Eq. 28: the recursion's W_i (Eq. 27) run by a genuine forward pass on the remaining tokens
      c_(i+1)..c_n, x vs the model's own forward pass with the whole context; control: W_0 on them;
    - Eq. 31: the product W_0 (I + h_1 A_1) ⋯ (I + h_i A_i) run the same way vs the same forward pass
      with the whole context; control: the same factors multiplied in reverse order.
    Plus, for the record, the weight-level gap product vs recursion (equal by associativity: not a claim)
    and the step norms ‖W_i − W_(i−1)‖ per task. `a_suffix` (S_i = A(c_(i+1)..c_n, x)) defaults to the
    model's own; pass wrong ones and the claims fail."""
    W0 = model.mlp.w1.weight
    s = suffix_contextual_outputs(model.contextual, tokens) if a_suffix is None else a_suffix
    weights = factorized_weights(W0, s)  # W_0 .. W_n (Eq. 27)
    factors = factor_matrices(s)
    products, reversed_ = factor_products(W0, factors), reversed_products(W0, factors)
    full = model(tokens)[:, -1]  # Φ_{W_0}(c_1..c_n, x), the output vector at the query
    n = tokens.shape[1] - 1
    curves = {k: [] for k in ("eq28", "eq28_ctrl", "eq31", "eq31_ctrl")}
    for i in range(n + 1):
        rest = tokens[:, i:]
        curves["eq28"].append(_gap(model, weights[:, i], rest, full))
        curves["eq28_ctrl"].append((model(rest)[:, -1] - full).abs().max())
        curves["eq31"].append(_gap(model, products[:, i], rest, full))
        curves["eq31_ctrl"].append(_gap(model, reversed_[:, i], rest, full))
    amax = lambda t: t.abs().amax(dim=(0, 2, 3))  # noqa: E731
    # Cor. 2.5.1's W_0 + ΔW(C): another matrix with W A(x) = W_0 A(C, x), for comparison with W_n
    eq2_patch = W0 + context_patch(W0, s[:, 0], s[:, -1])
    return {"eq28_max_abs_err": torch.stack(curves["eq28"]), "eq28_control_unpatched": torch.stack(curves["eq28_ctrl"]),
            "eq31_max_abs_err": torch.stack(curves["eq31"]), "eq31_control_reversed": torch.stack(curves["eq31_ctrl"]),
            "eq31_product_vs_recursion_max_abs": amax(products - weights),
            "weight_max_abs": amax(weights), "output_max_abs": full.abs().max(),
            "wn_vs_eq2_patch_max_abs": (weights[:, -1] - eq2_patch).abs().max(),
            "steps": increment_norms(weights)}


def _gap(model: ContextualBlock, W: Tensor, tokens: Tensor, reference: Tensor) -> Tensor:
    """max |Φ_W(tokens) − reference| at the query, Φ_W a genuine forward pass with W as the first MLP matrix."""
    return (forward_with(model, {W_NAME: W}, tokens)[:, -1] - reference).abs().max()


def run(cfg: FactorizationConfig, ctx: RunContext) -> None:
    device, run_dtype = ctx.device, ctx.dtype
    model, built = pretrained_block(cfg, ctx)
    tasks = sample_prompts(cfg.factorization.n_tasks, cfg.task.n_examples, built.task.d,
                           torch.Generator().manual_seed(cfg.factorization.data_seed))
    dtypes = [run_dtype] + ([torch.float64] if cfg.factorization.float64 and run_dtype != torch.float64 else [])
    results = {}
    with progress(len(dtypes), "factorization") as bar:
        for dtype in dtypes:
            net = copy.deepcopy(model).to(device, dtype)  # the same trained weights, in this dtype
            r = factorization_errors(net, tasks.tokens.to(device, dtype))
            index = dict(seed=cfg.seed, dtype=dtype_name(dtype))
            for i in range(cfg.task.n_examples + 1):
                ctx.log_many({k: r[k][i] for k in ("eq28_max_abs_err", "eq28_control_unpatched", "eq31_max_abs_err",
                                                   "eq31_control_reversed", "eq31_product_vs_recursion_max_abs",
                                                   "weight_max_abs")}, tokens_consumed=i, **index)
            for name, values in r["steps"].items():
                for t, row in enumerate(values.double().cpu().tolist()):
                    for i, v in enumerate(row):
                        ctx.log(f"step_norm_{name}", v, tokens_consumed=i + 1, task=t, **index)
            ctx.log_many({k: r[k] for k in ("output_max_abs", "wn_vs_eq2_patch_max_abs")}, **index)
            results[dtype] = r
            bar.advance(1, info=dtype_name(dtype))
    for dtype, r in results.items():  # the run's dtype under the plain ids; the float64 re-check beside it
        check_claims(ctx, dtype, r, "" if dtype == run_dtype else "_float64")


def check_claims(ctx: RunContext, dtype: torch.dtype, r: dict[str, Tensor], suffix: str = "") -> None:
    name, eps = dtype_name(dtype), torch.finfo(dtype).eps
    bound = 100 * eps * max(1.0, r["output_max_abs"].item())
    eq28, eq31 = r["eq28_max_abs_err"].double(), r["eq31_max_abs_err"].double()
    ctx.check(f"dherin.eq28.output_kept{suffix}", SOURCE + " Eq 28",
              f"[{name}] Φ_(W_i)(c_(i+1)..c_n, x) = Φ_(W_0)(c_1..c_n, x) at every i, both genuine forward passes "
              "(max |diff| over i, tasks, output entries; bound 100 eps × max(1, max|output|))",
              eq28.max().item(), "<=", bound, measure="max |Φ_(W_i)(c_(i+1)..c_n, x) − Φ_(W_0)(C, x)|")
    ctrl = r["eq28_control_unpatched"].double()[1:]
    ctx.check(f"dherin.eq28.control_far_off{suffix}", SOURCE + " Eq 28 (control)",
              f"[{name}] the unpatched model on the remaining tokens is orders of magnitude further "
              "(log10 of mean control / mean error, i ≥ 1)",
              math.log10(ctrl.mean().item() / max(eq28[1:].mean().item(), 1e-300)), ">=", 3.0,
              measure="log10(control diff / Eq 28 error)")
    ctx.check(f"dherin.eq31.product_form{suffix}", SOURCE + " Eq 31",
              f"[{name}] the product W_0 (1 + h_1 A_1) ⋯ (1 + h_i A_i), run by a forward pass on the remaining "
              "tokens, gives the model's output with the whole context at every i (max |diff|; bound 100 eps × "
              "max(1, max|output|))", eq31.max().item(), "<=", bound,
              measure="max |product-form output − Φ_(W_0)(C, x)|")
    rev = r["eq31_control_reversed"].double()[2:]  # with fewer than two factors the order cannot matter
    ctx.check(f"dherin.eq31.control_reversed{suffix}", SOURCE + " Eq 31 (control)",
              f"[{name}] the factors in reverse order miss the output (log10 of mean reversed-order error / "
              "mean product error, i ≥ 2)", math.log10(rev.mean().item() / max(eq31[2:].mean().item(), 1e-300)),
              ">=", 3.0, measure="log10(reversed-order error / product error)")


# -- figure ----------------------------------------------------------------------------------------

CURVES = {
    "eq28_max_abs_err": (0, "Eq 28: max |Φ_(W_i)(c_(i+1:n), x) − Φ_(W_0)(C, x)|", {}),
    "eq28_control_unpatched": (0, "control: unpatched, remaining tokens", dict(ls=":")),
    "eq31_max_abs_err": (1, "Eq 31: max |Φ_(W_0 Π_(j≤i)(1 + h_j A_j))(c_(i+1:n), x) − Φ_(W_0)(C, x)|", {}),
    "eq31_control_reversed": (1, "control: factors in reverse order", dict(ls=":")),
}


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(3, width=3.8, height=3.1)
    dtypes = sorted(metrics["dtype"].dropna().unique())
    for di, dt in enumerate(dtypes):
        sub = metrics[metrics["dtype"] == dt]
        for name, (col, label, style) in CURVES.items():
            rows = metric(sub, name)
            if rows.empty:
                continue
            g = rows.groupby("tokens_consumed")["value"].max().reset_index()
            if "control" in name:  # at i = 0 nothing is consumed yet: the control is trivially 0
                g = g[g["tokens_consumed"] > 0]
            axes[0][col].plot(g["tokens_consumed"], g["value"].clip(lower=1e-20), color=f"C{di}", lw=1.2,
                              label=f"{label} [{dt}]", **style)
        for name, style in (("step_norm_op2", {}), ("step_norm_fro", dict(ls="--"))):
            rows = metric(sub, name)
            if rows.empty:
                continue
            agg = mean_sem(rows, "tokens_consumed")
            norm = "2-norm" if name.endswith("op2") else "Frobenius"
            mean_band(axes[0][2], agg, "tokens_consumed", color=f"C{di}", lw=1.2, label=f"{norm} [{dt}]", **style)
    axes[0][0].set(yscale="log", xlabel="tokens consumed i", ylabel="max abs difference",
                   title="Eq 28: output kept at every step")
    axes[0][1].set(yscale="log", xlabel="tokens consumed i", ylabel="max abs difference",
                   title="Eq 31: product form of $W_i$, by forward pass")
    axes[0][2].set(yscale="log", xlabel="tokens consumed i", ylabel=r"$\|W_i - W_{i-1}\|$",
                   title="App. E step sizes (mean ± s.e. over tasks)")
    for ax in axes[0]:
        ax.legend(fontsize=6, loc="best")
    return save_figure(fig, figures_dir, "figE_factorization")


def validate(cfg: FactorizationConfig) -> None:
    require_positive(cfg, "factorization.n_tasks", "task.n_examples", "eval.n_val_tasks", "train.steps")
    if cfg.model.mlp_skip:
        raise UserError("model.mlp_skip=true: App. E's dynamics is for the block without MLP skip (ΔW alone)")
    validate_checkpoint(cfg)
