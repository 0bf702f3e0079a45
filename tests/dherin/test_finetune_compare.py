"""finetune_compare end to end through the CLI at preset=smoke (one run and an lr sweep), and its
batched SGD against a plain per-trial loop."""


import pandas as pd
import pytest
import torch

from experiments.dherin.finetune_compare.run import (
    normalized_inner,
    query_predictions,
    rank1_ceiling,
    sgd_path,
    task_specificity,
)
from experiments.dherin.models.linreg import MLP

FIGURE = "fig4_finetune_compare"
EXPERIMENT = "finetune_compare"  # the shared smoke run (tests/helpers/smoke_runs.py)
M, TRIALS = 20, 12  # the smoke preset's context length and trial count
SERIES = ("gd_test_loss", "dw_test_loss", "cos_dw_ft", "cos_random_rank1_ft", "cos_other_task_dw_ft",
          "cos_dw_step_ft_step", "rank1_ceiling_ft")


def test_draws_the_papers_figure_and_saves_its_model(smoke_run):
    """The paper's figure by name, and the trained model `checkpoint=` reads (the contract test checks the rest)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file() and (smoke_run / "model.pt").is_file()


def test_every_trial_and_step_is_recorded(smoke_run):
    m = pd.read_csv(smoke_run / "metrics.csv")
    for name in SERIES:
        rows = m[m.metric == name]
        first = 0 if name.endswith("loss") else 1  # i = 0 of the losses is the unpatched, unfinetuned model
        assert len(rows) == TRIALS * (M + 1 - first), name
        assert sorted(rows.context_length.unique()) == list(range(first, M + 1))
        assert (rows.lr == 0.3).all()
    start = m[m.context_length == 0].pivot_table(index="trial", columns="metric", values="value")
    pd.testing.assert_series_equal(start.gd_test_loss, start.dw_test_loss, check_names=False)
    # no rank-1 matrix with right factor A(x_test) beats the structural ceiling (Cauchy–Schwarz); the
    # ceiling is below 1 because the SGD steps' right factors are A((x_k, 0)), not A(x_test)
    cells = m[m.context_length > 0].pivot_table(index=["trial", "context_length"], columns="metric", values="value")
    assert (cells.cos_dw_ft <= cells.rank1_ceiling_ft + 1e-5).all()
    assert (cells.cos_other_task_dw_ft.abs() <= cells.rank1_ceiling_ft + 1e-5).all()
    assert cells.rank1_ceiling_ft.max() < 1 - 1e-3
    # ΔW's test prediction is the with-context prediction; the MLP shortcut is the full model's forward
    assert m[m.metric == "dw_vs_context_max_abs"].value.iloc[0] < 1e-5
    assert m[m.metric == "shortcut_vs_full_forward_max_abs"].value.iloc[0] < 1e-5
    # finetuning changed the loss (the control at i = 0 is not what SGD ends at)
    gd = m[m.metric == "gd_test_loss"].pivot_table(index="trial", columns="context_length", values="value")
    assert (gd[M] - gd[0]).abs().max() > 1e-4


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    assert c.id.str.startswith("dherin.fig4.").sum() == 5
    # the task-specificity control is by magnitude, recomputable from the logged inner products at i = M
    m = pd.read_csv(smoke_run / "metrics.csv")
    last = m[m.context_length == M].pivot_table(index="trial", columns="metric", values="value")
    expected = last.cos_dw_ft.abs().mean() / last.cos_other_task_dw_ft.abs().mean()
    assert c.set_index("id").measured["dherin.fig4.alignment_task_specific"] == pytest.approx(expected, rel=1e-6)
    assert c.set_index("id").passed["dherin.cor2_5_1.dw_prediction_equals_context"]
    assert c.measured.notna().all()


def test_lr_sweep_is_one_series_per_lr(smoke_run, icl, tmp_path):
    sweep = tmp_path / "sweep"
    proc = icl("run", "finetune_compare", "-m", "preset=smoke", f"checkpoint={smoke_run}", "finetune.n_trials=3",
               "finetune.lr=0.003,0.03", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = pd.concat([pd.read_csv(sweep / j / "metrics.csv") for j in ("0", "1")])
    assert sorted(m.lr.dropna().unique()) == [0.003, 0.03]
    dw = m[m.metric == "dw_test_loss"].pivot_table(index=["trial", "context_length"], columns="lr", values="value")
    pd.testing.assert_series_equal(dw[0.003], dw[0.03], check_names=False)  # ΔW does not depend on lr
    gd = m[(m.metric == "gd_test_loss") & (m.context_length == M)].groupby("lr").value.mean()
    assert abs(gd[0.003] - gd[0.03]) > 1e-6
    assert (sweep / "figures" / f"{FIGURE}.png").stat().st_size > 1000


def test_batched_sgd_is_plain_sgd_per_trial():
    """vmap(grad) over trials = a Python loop of torch.autograd SGD steps, one trial at a time."""
    torch.manual_seed(0)
    mlp = MLP(3, 8, 3).double()
    g = torch.Generator().manual_seed(1)
    T, K, lr = 4, 5, 0.1
    a = torch.randn(T, K, 3, generator=g, dtype=torch.float64)
    y = torch.randn(T, K, generator=g, dtype=torch.float64)
    W0 = mlp.w1.weight.detach()
    path = sgd_path(mlp, W0, a, y, lr)
    assert path.shape == (T, K, 8, 3)
    for t in range(T):
        W = W0.clone()
        for k in range(K):
            W.requires_grad_(True)
            h = torch.relu(a[t, k] @ W.T + mlp.w1.bias)
            loss = 0.5 * (mlp.w2(h)[-1] - y[t, k]) ** 2
            (grad,) = torch.autograd.grad(loss, W)
            W = (W - lr * grad).detach()
            torch.testing.assert_close(path[t, k], W, rtol=0, atol=1e-14)
    pred = query_predictions(mlp, path, a[:, 0])
    torch.testing.assert_close(pred[2, 3], mlp.w2(torch.relu(path[2, 3] @ a[2, 0] + mlp.w1.bias))[-1])


def test_normalized_inner_product():
    A = torch.randn(2, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(normalized_inner(A, 3 * A), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(normalized_inner(A, -A), -torch.ones(2, dtype=torch.float64))


def test_task_specificity_is_by_magnitude():
    """Another task's inner products have random signs: the old control divided by |their signed mean| (≈ 0)
    and passed with a huge ratio; by magnitude an unrelated ΔW aligned almost as well fails the claim."""
    own = torch.full((100,), 0.184, dtype=torch.float64)
    other = 0.155 * torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(50)
    old_ratio = own.mean() / other.mean().abs().clamp_min(1e-12)
    assert old_ratio > 1e6  # what the old claim measured: noise, and a pass
    assert task_specificity(own, other) == pytest.approx(0.184 / 0.155)
    assert task_specificity(own, other) < 2.0  # the claim's bar: it fails, as it should
    assert task_specificity(own, 0.01 * other) > 2.0  # an unrelated ΔW that is really unaligned: it passes


def test_rank1_ceiling_is_the_best_rank1_alignment():
    g = torch.Generator().manual_seed(2)
    U = torch.randn(3, 2, 6, 4, generator=g, dtype=torch.float64)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ceiling = rank1_ceiling(U, a)
    assert ceiling.shape == (3, 2) and (ceiling < 1).all()
    best = (U @ a[:, None, :, None]) * a[:, None, None, :]  # u* aᵀ with u* = U a attains it
    torch.testing.assert_close(normalized_inner(best, U), ceiling, rtol=1e-12, atol=1e-12)
    for _ in range(20):  # any other left factor does worse
        u = torch.randn(3, 2, 6, 1, generator=g, dtype=torch.float64)
        assert (normalized_inner(u * a[:, None, None, :], U) <= ceiling + 1e-12).all()
    rank1 = torch.randn(3, 1, 6, 1, generator=g, dtype=torch.float64) * a[:, None, None, :]
    torch.testing.assert_close(rank1_ceiling(rank1, a), torch.ones(3, 1, dtype=torch.float64))
