"""markov_collapse — Xu & Fang Thm 5.2 (a rate the paper proves but does not plot).

Setup. A Gaussian stream x_t = B z_t (Σ = BBᵀ) through an L-layer stack of frozen random single-head
causal attentions with residual blocks h^(ℓ) = h^(ℓ-1) + y^(ℓ) (Φ(h, y) = h + y: Lipschitz and linear,
so the hidden states are Gaussian in the limit, as Assumption 5.1 asks). Thm 5.2: the terminal state
forgets its context, E‖h_t^(L) − F^(L)(x_t)‖² ≤ C_L T_L / t, with F^(L) the context-free map of Eq. 6.

How the population covariances Σ_0..Σ_{L-1} of Eq. 6 are estimated: a long independent run (its own
streams, same Σ and heads) is pushed through the stack; the empirical covariance of h^(ℓ) pooled
over every stream's positions after a burn-in (where the hidden states have nearly reached
equilibrium) is Σ̂_ℓ. Beside it, the exact Σ_ℓ: here h^(ℓ) = M_ℓ h^(ℓ-1) in the limit, so
Σ_ℓ = M_ℓ Σ_{ℓ-1} M_ℓᵀ with M_ℓ = I + Θ_V Σ_{ℓ-1} Θ_Kᵀ Θ_Q /√d_k, which checks the estimate.
Control: a covariance-blind F^(L) (every Σ_ℓ replaced by (tr Σ_ℓ / d) I), which must not be reached.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.core.errors import UserError
from experiments.core.plotting import metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.xu_fang.closed_forms import tilt_variance
from experiments.xu_fang.collapse import (
    Head,
    context_free_map,
    estimate_covariances,
    population_covariances,
    random_heads,
    stack_forward,
)
from experiments.xu_fang.fitting import log_binned_means, loglog_fit
from experiments.xu_fang.markov_collapse import MarkovCollapseConfig
from experiments.xu_fang.streams import gaussian_stream, random_covariance_factor

SOURCE = "Xu & Fang Thm 5.2"


def run_stack(x: torch.Tensor, heads: list[Head], device, dtype) -> list[torch.Tensor]:
    """The frozen stack's forward pass in the run's dtype; hidden states back as float64 on the CPU."""
    hidden = stack_forward(x.to(device, dtype), [h.to(dtype, device) for h in heads])
    return [h.double().cpu() for h in hidden]


def isotropic(sigma: torch.Tensor) -> torch.Tensor:
    return torch.trace(sigma) / sigma.shape[0] * torch.eye(sigma.shape[0], dtype=sigma.dtype)


@torch.no_grad()
def run(cfg: MarkovCollapseConfig, ctx: RunContext) -> None:
    generator = torch.Generator().manual_seed(cfg.seed)
    index = dict(seed=cfg.seed, dtype=dtype_name(ctx.dtype))
    factor = random_covariance_factor(cfg.d, generator)
    sigma = factor @ factor.T
    heads = random_heads(cfg.layers, cfg.d, cfg.d_k or cfg.d, cfg.head_scale, generator)
    with progress(2, "markov_collapse") as bar:
        # 1. Population covariances from a long independent run (and exactly, as a check).
        e = cfg.estimate
        long_run = run_stack(gaussian_stream(factor, e.seq_len, generator, e.streams), heads, ctx.device, ctx.dtype)
        estimated = estimate_covariances(long_run[:-1], e.burn_in)
        exact = population_covariances(sigma, heads)[:-1]
        bar.advance(1, info="covariances estimated")
        # 2. Test streams: the stack's hidden states against the context-free maps.
        x = gaussian_stream(factor, cfg.seq_len, generator, cfg.streams)
        hidden = run_stack(x, heads, ctx.device, ctx.dtype)
        bar.advance(1, info="test streams")
    maps = {"estimated": estimated, "exact": exact, "blind": [isotropic(s) for s in estimated]}
    positions = np.arange(1, cfg.seq_len + 1)
    fits = {}
    for layer in range(1, cfg.layers + 1):
        ctx.log("cov_rel_error", (estimated[layer - 1] - exact[layer - 1]).norm() / exact[layer - 1].norm(),
                layer=layer - 1, **index)
        q = hidden[layer - 1][:, cfg.seq_len // 2:] @ heads[layer - 1].theta_q.T  # the queries of layer ℓ
        v = tilt_variance(exact[layer - 1], heads[layer - 1].theta_k, q.reshape(-1, q.shape[-1]))
        ctx.log("cone_fraction", (v <= 1).double().mean(), layer=layer, **index)  # Thm 5.2 asks for v ≤ 1
        for name, sigmas in maps.items():
            f = context_free_map(x, heads[:layer], sigmas[:layer])
            mse = ((hidden[layer] - f) ** 2).sum(-1).mean(0).numpy()  # over streams, per position
            t_bin, mse_bin = log_binned_means(positions, mse, cfg.bins_per_decade)
            for t, value in zip(t_bin, mse_bin, strict=True):
                ctx.log(f"mse_{name}", value, layer=layer, token_index=float(t), **index)
            sel = t_bin >= cfg.fit_min_t
            fits[(layer, name)] = (loglog_fit(t_bin[sel], mse_bin[sel])[0], float(mse[-cfg.late_window:].mean()))
            ctx.log(f"slope_{name}", fits[(layer, name)][0], layer=layer, **index)
    check_claims(ctx, cfg, fits, [float(m) for m in metric(ctx.metrics(), "cov_rel_error")["value"]])


def check_claims(ctx: RunContext, cfg: MarkovCollapseConfig, fits: dict, cov_errors: list[float]) -> None:
    k, L = cfg.claims, cfg.layers
    ctx.check("xu_fang.thm5_2.collapse_rate", SOURCE,
              f"E‖h_t^(L) − F^(L)(x_t)‖² ∝ 1/t at the last layer, F from estimated covariances "
              f"(log-log slope, t ≥ {cfg.fit_min_t})", fits[(L, "estimated")][0], "within", k.slope_tolerance,
              paper_value=-1.0)
    ctx.check("xu_fang.thm5_2.collapse_rate_exact_cov", SOURCE,
              f"same with the exact population covariances (log-log slope, t ≥ {cfg.fit_min_t})",
              fits[(L, "exact")][0], "within", k.slope_tolerance, paper_value=-1.0)
    ctx.check("xu_fang.eq6.covariances_match", SOURCE + " / Eq. 6",
              "estimated population covariances match the closed form (max relative Frobenius error over layers)",
              max(cov_errors), "<=", k.max_cov_error)
    ratio = fits[(L, "blind")][1] / fits[(L, "estimated")][1]
    ctx.check("xu_fang.thm5_2.control_blind", SOURCE + " (control)",
              f"a covariance-blind F^(L) is not reached: its error / the readout's (last {cfg.late_window} positions)",
              ratio, ">=", k.min_control_ratio)


# -- figure ------------------------------------------------------------------------------------

def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    est = metric(metrics, "mse_estimated")
    layers = sorted(est["layer"].unique())
    fig, axes = new_figure(2, width=3.8, height=3.2)
    ax_layers, ax_ctrl = axes[0]
    for i, layer in enumerate(layers):
        curve = est[est["layer"] == layer].groupby("token_index", as_index=False)["value"].mean()
        ax_layers.plot(curve["token_index"], curve["value"], color=f"C{i}", lw=1.4, label=f"ℓ = {int(layer)}")
    top = max(layers) if layers else None
    for name, label, color, ls in (("mse_estimated", r"$F^{(L)}$ from estimated $\hat\Sigma_\ell$", "C0", "-"),
                                   ("mse_exact", r"$F^{(L)}$ from exact $\Sigma_\ell$", "C1", "--"),
                                   ("mse_blind", r"control: covariance-blind $F^{(L)}$", "C3", ":")):
        frame = metric(metrics, name)
        curve = frame[frame["layer"] == top].groupby("token_index", as_index=False)["value"].mean()
        ax_ctrl.plot(curve["token_index"], curve["value"], color=color, ls=ls, lw=1.4, label=label)
    for ax in (ax_layers, ax_ctrl):
        if not est.empty:
            t = np.geomspace(8, est["token_index"].max(), 10)
            ref = est[est["layer"] == top].groupby("token_index")["value"].mean()
            c = float((ref * ref.index).iloc[len(ref) // 2:].mean())
            ax.plot(t, c / t, color="k", ls="--", lw=0.7, label=r"$\propto 1/t$")
        ax.set(xscale="log", yscale="log", xlabel="token position t",
               ylabel=r"$\mathbb{E}\|h_t^{(\ell)} - F^{(\ell)}(x_t)\|^2$")
        ax.legend(fontsize=6.5)
    ax_layers.set_title("Context forgetting, per layer (Thm 5.2)")
    ax_ctrl.set_title(f"Terminal layer L = {int(top) if top else '?'} and control")
    return save_figure(fig, figures_dir, "markov_collapse")


def validate(cfg: MarkovCollapseConfig) -> None:
    require_positive(cfg, "d", "layers", "streams", "seq_len", "fit_min_t", "late_window", "bins_per_decade")
    if not 0 <= cfg.estimate.burn_in < cfg.estimate.seq_len - 1:
        raise UserError(f"estimate.burn_in={cfg.estimate.burn_in} must be below "
                        f"estimate.seq_len={cfg.estimate.seq_len}")
    if cfg.fit_min_t * 4 > cfg.seq_len or cfg.late_window > cfg.seq_len:
        raise UserError(f"fit_min_t={cfg.fit_min_t} (×4) and late_window={cfg.late_window} "
                        f"must fit in seq_len={cfg.seq_len}")
