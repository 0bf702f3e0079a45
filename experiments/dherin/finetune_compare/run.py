"""finetune_compare — Dherin et al. §4.4, Fig. 4: the implicit update ΔW(C_i) vs explicit finetuning.

Setup. Take linreg_icl's trained block (trained in the run, or checkpoint=PATH) with first MLP
matrix W_0. For each of 100 trials draw a fresh ω_test, examples x_1..x_M (M = N) and a test query
x_test. For i = 1..M:
- GD test loss: finetune only W from W_0 by SGD, one example at a time in context order (the
  example (x_k, ωᵀx_k) is the prompt [(x_k, 0)] with target ωᵀx_k, loss ½(ŷ − y)²), then the loss of
  the finetuned model on the test query (x_test, 0) alone;
- ΔW test loss: the loss on the same query alone of W_0 + ΔW(C_i), C_i = the first i examples;
- the normalized Frobenius inner product ⟨ΔW(C_i), W_ft,i − W_0⟩ / (‖ΔW(C_i)‖ ‖W_ft,i − W_0‖).
Controls: the unpatched model on the query alone (i = 0 of both curves), and the inner product of
the finetuning update with a random rank-1 direction and with another task's ΔW for the same query
(compared by magnitude: its signed mean is near 0), and the structural ceiling: the best inner
product any rank-1 matrix with right factor A(x_test) (ΔW's shape) can have with the SGD update.

Only W changes, and W is applied after the contextual layer A, so A(x) of every one-token prompt
is computed once by the model's own contextual layer; the 100 trials' finetuning then runs as a
batch of per-trial W's through the model's MLP (torch.func: vmap of grad of functional_call).
One full-model forward pass of the finetuned and patched weights checks that shortcut; the claim that
ΔW(C_i) replaces the context is judged on genuine forward passes alone (patched weights on x_test vs
the model on [C_i, x_test]), so a wrong A(C_i, x) cannot make it hold.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from experiments.core.errors import UserError
from experiments.core.plotting import mean_band, mean_sem, metric, new_figure, save_figure
from experiments.core.progress import progress
from experiments.core.results import RunContext
from experiments.core.runtime import dtype_name
from experiments.core.validation import require_positive
from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import prefix_contextual_outputs, prefix_model_outputs, prefix_patches_from_outputs
from experiments.dherin.finetune_compare import FinetuneCompareConfig
from experiments.dherin.patched_forward import W_NAME, forward_with
from experiments.dherin.pretrained import pretrained_block, validate_checkpoint

SOURCE = "Dherin §4.4 Fig 4"
MLP_W = "w1.weight"  # W inside model.mlp


def mlp_prediction(mlp: nn.Module, W: Tensor, a: Tensor) -> Tensor:
    """ŷ = last component of φ_W(a) for one weight matrix W (m, d_in) and one A-output a (d_in,)."""
    return functional_call(mlp, {MLP_W: W}, (a,))[-1]


def sgd_path(mlp: nn.Module, W0: Tensor, a_examples: Tensor, targets: Tensor, lr: float) -> Tensor:
    """Online SGD on W alone, one example per step in order: W_k = W_{k−1} − lr ∇_W ½(ŷ_k − y_k)².

    a_examples (T, M, d_in) are A((x_k, 0)) of each trial's examples, targets (T, M). Every trial
    has its own W, stepped together (vmap over trials). Returns W_1..W_M (T, M, m, d_in).
    """
    def loss(W: Tensor, a: Tensor, y: Tensor) -> Tensor:
        return 0.5 * (mlp_prediction(mlp, W, a) - y) ** 2

    step_grad = vmap(grad(loss))
    W = W0.expand(a_examples.shape[0], *W0.shape)
    path = []
    for k in range(a_examples.shape[1]):
        W = W - lr * step_grad(W, a_examples[:, k], targets[:, k])
        path.append(W)
    return torch.stack(path, dim=1)


def query_predictions(mlp: nn.Module, weights: Tensor, a_query: Tensor) -> Tensor:
    """ŷ(x_test) for every trial t and step i with W = weights[t, i] (T, M, m, d_in); a_query (T, d_in)."""
    per_step = vmap(mlp_prediction, in_dims=(None, 0, None))
    return vmap(per_step, in_dims=(None, 0, 0))(mlp, weights, a_query)


def normalized_inner(a: Tensor, b: Tensor) -> Tensor:
    """⟨A, B⟩_F / (‖A‖_F ‖B‖_F) over the last two dims."""
    return (a * b).sum((-2, -1)) / (torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b))


def rank1_ceiling(update: Tensor, a_query: Tensor) -> Tensor:
    """The best normalized inner product any rank-1 u A(x)ᵀ reaches against `update` (…, m, d_in):
    max_u ⟨u aᵀ, U⟩ / (‖u aᵀ‖ ‖U‖) = ‖U a‖ / (‖a‖ ‖U‖_F), attained at u = U a (Cauchy–Schwarz).

    ΔW(C_i) always has right factor A(x_test), while the SGD steps have right factors A((x_k, 0)): this
    structural ceiling, not 1, is how aligned ΔW could possibly be. a_query is (T, d_in), update (T, M, m, d_in)."""
    a = a_query[:, None, :, None]  # (T, 1, d_in, 1)
    return torch.linalg.vector_norm(update @ a, dim=(-2, -1)) / (
        torch.linalg.vector_norm(a, dim=(-2, -1)) * torch.linalg.matrix_norm(update))


def task_specificity(cos_own: Tensor, cos_other: Tensor) -> float:
    """mean |cos| with the trial's own ΔW over mean |cos| with another task's ΔW.

    By magnitude: another task's inner product has a random sign, so its signed mean is near 0 and a
    ratio to it is noise; its mean magnitude says how aligned an unrelated ΔW is."""
    return float(cos_own.abs().mean() / cos_other.abs().mean())


def random_rank1(shape: torch.Size, generator: torch.Generator, dtype, device) -> Tensor:
    """u vᵀ with Gaussian u, v: the control direction for the inner product."""
    u = torch.randn(*shape[:-1], 1, generator=generator)
    v = torch.randn(*shape[:-2], 1, shape[-1], generator=generator)
    return (u * v).to(device, dtype)


def run(cfg: FinetuneCompareConfig, ctx: RunContext) -> None:
    device, dtype = ctx.device, ctx.dtype
    lr = cfg.finetune.lr
    index = dict(seed=cfg.seed, dtype=dtype_name(dtype), lr=lr)
    model, built = pretrained_block(cfg, ctx)
    mlp, W0 = model.mlp, model.mlp.w1.weight
    gen = torch.Generator().manual_seed(cfg.finetune.data_seed)
    trials = sample_prompts(cfg.finetune.n_trials, cfg.task.n_examples, built.task.d, gen).to(device, dtype)
    T, M = trials.context.shape[:2]
    y_examples = trials.context[..., -1]  # ωᵀx_k, the finetuning targets
    examples = torch.cat([trials.context[..., :-1], torch.zeros_like(y_examples[..., None])], -1)  # (x_k, 0)

    with progress(3, "finetune_compare") as bar:
        # the implicit dynamics: ΔW(C_i), i = 1..M, and its test predictions on x_test alone
        a = prefix_contextual_outputs(model.contextual, trials.tokens)  # A(C_i, x_test), i = 0..M
        dW = prefix_patches_from_outputs(W0, a)
        a_query = a[:, 0]
        pred_dw = query_predictions(mlp, W0 + dW, a_query)
        pred_ctx = mlp(a[:, 1:])[..., -1]  # Φ_W(C_i, x_test): the same numbers, with the context
        bar.advance(1, info="ΔW(C_i)")
        # explicit finetuning of W, one example at a time
        with torch.no_grad():
            a_examples = model.contextual(examples.reshape(T * M, 1, -1))[:, -1].reshape(T, M, -1)
        W_ft = sgd_path(mlp, W0, a_examples, y_examples, lr)
        pred_gd = query_predictions(mlp, W_ft, a_query)
        bar.advance(1, info="SGD")
        # the shortcut through the MLP equals the full model's forward pass of the changed weights
        query = trials.query
        with torch.no_grad():
            full_gd = forward_with(model, {W_NAME: W_ft[:, -1]}, query)[:, -1, -1]
            full_dw = forward_with(model, {W_NAME: W0 + dW[:, -1]}, query)[:, -1, -1]
            pred_none = model(query)[:, -1, -1]
        shortcut_err = max((full_gd - pred_gd[:, -1]).abs().max().item(), (full_dw - pred_dw[:, -1]).abs().max().item())
        # Cor. 2.5.1, both sides genuine forward passes: the patched weights W_0 + ΔW(C_i) on x_test alone
        # against the unpatched model's own pass on [C_i, x_test] (no A(C_i, x) shared between the two)
        dw_forward = forward_with(model, {W_NAME: (W0 + dW).reshape(T * M, *W0.shape)},
                                  query.repeat_interleave(M, dim=0))[:, -1, -1].reshape(T, M)
        context_forward = prefix_model_outputs(model, trials.tokens)[:, 1:, -1]
        # alignment of the two updates, and its controls. Beside the accumulated updates ΔW(C_i) vs
        # W_ft,i − W_0 (the paper's comparison), the i-th steps alone: the implicit dynamics' step
        # (ΔW)_i − (ΔW)_(i−1) (Prop. 3.1) vs the i-th SGD step W_ft,i − W_ft,i−1.
        update = W_ft - W0
        ft_steps = update.diff(dim=1, prepend=torch.zeros_like(update[:, :1]))
        dw_steps = dW.diff(dim=1, prepend=torch.zeros_like(dW[:, :1]))
        cos = normalized_inner(dW, update)
        cos_random = normalized_inner(random_rank1(dW.shape, gen, dtype, device), update)
        # another task's ΔW for the same query x_test: trial t−1's examples, trial t's query, so it has the
        # same right factor A(x_test) and only the task differs (a fair control of task specificity)
        other_tokens = torch.cat([trials.context.roll(1, dims=0), trials.query], dim=1)
        dW_other = prefix_patches_from_outputs(W0, prefix_contextual_outputs(model.contextual, other_tokens))
        cos_other = normalized_inner(dW_other, update)
        ceiling = rank1_ceiling(update, a_query)
        cos_step_step = normalized_inner(dw_steps, ft_steps)
        bar.advance(1, info="inner products")

    y = trials.targets
    loss = lambda p: 0.5 * (p - y[:, None]) ** 2  # noqa: E731
    series = {"gd_test_loss": loss(pred_gd), "dw_test_loss": loss(pred_dw), "cos_dw_ft": cos,
              "cos_random_rank1_ft": cos_random, "cos_other_task_dw_ft": cos_other,
              "cos_dw_step_ft_step": cos_step_step, "rank1_ceiling_ft": ceiling}
    for name, values in series.items():
        for (t, i), v in _cells(values):
            ctx.log(name, v, trial=t, context_length=i + 1, **index)
    for t, v in enumerate((0.5 * (pred_none - y) ** 2).double().cpu().tolist()):  # i = 0: no update, no context
        ctx.log("gd_test_loss", v, trial=t, context_length=0, **index)
        ctx.log("dw_test_loss", v, trial=t, context_length=0, **index)
    ctx.log("dw_vs_context_max_abs", (pred_dw - pred_ctx).abs().max(), **index)
    ctx.log("shortcut_vs_full_forward_max_abs", shortcut_err, **index)
    genuine_gap = (dw_forward - context_forward).abs().max().item()
    ctx.log("dw_forward_vs_context_forward_max_abs", genuine_gap, **index)
    check_claims(ctx, dtype, series, 0.5 * (pred_none - y) ** 2, genuine_gap)


def _cells(values: Tensor):
    array = values.double().cpu().numpy()
    for t in range(array.shape[0]):
        for i in range(array.shape[1]):
            yield (t, i), array[t, i]


def check_claims(ctx: RunContext, dtype, series: dict[str, Tensor], loss_none: Tensor, dw_ctx_gap: float) -> None:
    initial = loss_none.double().mean().item()
    gd_final = series["gd_test_loss"][:, -1].double().mean().item()
    dw_final = series["dw_test_loss"][:, -1].double().mean().item()
    ctx.check("dherin.fig4.dw_minimizes_test_loss", SOURCE + " left",
              "the implicit update ΔW(C_M) minimizes the test loss: mean ΔW test loss at i = M / "
              "mean loss without context or update", dw_final / initial, "<=", 0.5,
              measure="ΔW test loss at i = M / loss without context")
    ctx.check("dherin.fig4.finetuning_minimizes_test_loss", SOURCE + " left",
              "finetuning W by SGD on the M examples minimizes the test loss: mean GD test loss at i = M / "
              "mean loss without context or update", gd_final / initial, "<=", 0.5,
              measure="GD test loss at i = M / loss without context")
    cos = series["cos_dw_ft"][:, -1].double()
    ctx.check("dherin.fig4.updates_aligned", SOURCE + " right",
              "the two updates are highly aligned: normalized Frobenius inner product "
              "⟨ΔW(C_M), W_ft,M − W_0⟩ at i = M, mean over trials", cos.mean().item(), ">=", 0.5,
              measure="mean cos⟨ΔW(C_M), W_ft,M − W_0⟩")
    ctx.check("dherin.fig4.alignment_task_specific", SOURCE + " right (control)",
              "the alignment is specific to the task: mean |inner product| with the trial's own ΔW(C_M) over that "
              "with another task's ΔW for the same query (by magnitude), at i = M",
              task_specificity(cos, series["cos_other_task_dw_ft"][:, -1].double()), ">=", 2.0,
              measure="mean |cos| own ΔW / mean |cos| other task's ΔW")
    ceiling = series["rank1_ceiling_ft"][:, -1].double()
    ctx.check("dherin.fig4.alignment_near_rank1_ceiling", SOURCE + " right",
              "ΔW reaches most of the alignment any rank-1 matrix with right factor A(x_test) could have with the "
              "finetuning update: mean inner product / mean structural ceiling ‖U A(x)‖/(‖A(x)‖ ‖U‖), at i = M",
              cos.mean().item() / ceiling.mean().item(), ">=", 0.5, measure="mean cos / mean rank-1 ceiling")
    ctx.check("dherin.cor2_5_1.dw_prediction_equals_context", "Dherin Cor 2.5.1",
              "ΔW test prediction = with-context prediction, both genuine forward passes: the model with "
              "W_0 + ΔW(C_i) on x_test alone vs the unpatched model on [C_i, x_test], every i and trial "
              f"(bound 1000 eps of {dtype_name(dtype)})",
              dw_ctx_gap, "<=", 1000 * torch.finfo(dtype).eps,
              measure="max |Φ_(W+ΔW(C_i))(x) − Φ_W(C_i, x)|")


# -- figure ----------------------------------------------------------------------------------------


def plot(metrics: pd.DataFrame, figures_dir: Path) -> list[Path]:
    fig, axes = new_figure(2, width=4.2, height=3.2)
    ax_loss, ax_cos = axes[0]
    lrs = sorted(metrics["lr"].dropna().unique())
    dtypes = sorted(metrics["dtype"].dropna().unique())
    for di, dt in enumerate(dtypes):
        sub = metrics[metrics["dtype"] == dt]
        tag = f" [{dt}]" if len(dtypes) > 1 else ""
        # ΔW is the same in every job of an lr sweep: one copy per (seed, trial, i)
        dw = metric(sub, "dw_test_loss").drop_duplicates(["seed", "trial", "context_length"])
        _band(ax_loss, mean_sem(dw, "context_length"), "ΔW test loss" + tag, color="C1" if di == 0 else f"C{di + 5}")
        for li, lr in enumerate(lrs):
            color = f"C{(li * 2 + di) % 10}" if li or di else "C0"
            gd = metric(sub[sub["lr"] == lr], "gd_test_loss")
            if gd.empty:
                continue
            _band(ax_loss, mean_sem(gd, "context_length"), f"GD test loss, lr={lr:g}" + tag, color=color, ls="--")
            for name, label, style in (("cos_dw_ft", "⟨ΔW(C_i), finetune update⟩", dict(color=color)),
                                       ("cos_dw_step_ft_step", "⟨i-th implicit step, i-th SGD step⟩",
                                        dict(color=color, ls="--", alpha=0.8)),
                                       ("rank1_ceiling_ft", "ceiling: best rank-1 with right factor A(x)",
                                        dict(color=color, ls=(0, (1, 3)), alpha=0.9)),
                                       ("cos_other_task_dw_ft", "control: another task's ΔW (same query)",
                                        dict(color=color, ls=":", alpha=0.8)),
                                       ("cos_random_rank1_ft", "control: random rank-1",
                                        dict(color="0.5", ls="-.", alpha=0.8))):
                if name in ("cos_random_rank1_ft", "cos_dw_step_ft_step") and li > 0:
                    continue  # ≈ 0 for every lr: once is enough
                rows = metric(sub[sub["lr"] == lr], name)
                if not rows.empty:
                    _band(ax_cos, mean_sem(rows, "context_length"), f"{label}, lr={lr:g}{tag}", **style)
    n = metrics["trial"].nunique() * max(1, metrics["seed"].nunique()) if "trial" in metrics else 0
    ax_loss.set(yscale="log", xlabel="context length i = number of finetuning steps", ylabel="test loss",
                title=f"Finetuning (GD) vs implicit update (ΔW)\nmean ± s.e.m. over n = {n} trials")
    ax_cos.set(xlabel="context length i = number of finetuning steps", ylabel="normalized Frobenius inner product",
               title=f"Alignment of the two weight updates\nmean ± s.e.m. over n = {n} trials")
    ax_cos.axhline(0, color="k", lw=0.5)
    ax_loss.legend(fontsize=6, loc="best")
    ax_cos.legend(fontsize=5.5, loc="center right")
    return save_figure(fig, figures_dir, "fig4_finetune_compare")


def _band(ax, agg: pd.DataFrame, label: str, **style) -> None:
    mean_band(ax, agg, "context_length", label=label, lw=1.3, **style)


def validate(cfg: FinetuneCompareConfig) -> None:
    if not (math.isfinite(cfg.finetune.lr) and cfg.finetune.lr > 0):  # a number: the schema types it
        raise UserError(f"finetune.lr={cfg.finetune.lr} must be a positive number")
    require_positive(cfg, "finetune.n_trials", "task.n_examples", "eval.n_val_tasks", "train.steps")
    if cfg.finetune.n_trials < 2:
        raise UserError("finetune.n_trials must be at least 2 (the other-task control pairs trials)")
    if cfg.model.mlp_skip:
        raise UserError("model.mlp_skip=true: §4.4 compares the ΔW of the block without MLP skip")
    validate_checkpoint(cfg)
