"""Xu & Fang's closed forms and our vectorized building blocks, each alone on small random cases.

Exactness checks run in float64 against brute force; closed forms are checked against Monte Carlo
with tolerances several standard errors wide (fixed seeds, so they are deterministic)."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.xu_fang import attention, closed_forms, collapse, fitting, gd, streams

pytestmark = pytest.mark.numeric  # rounding-level bounds: CI runs them again under another CPU kernel set

F64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def brute_causal_attention(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    t = scores.shape[-1]
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v


# -- attention -----------------------------------------------------------------------------------

@pytest.mark.parametrize("d_k,d_v", [(3, 5), (6, 2), (4, 4)])
def test_causal_head_is_masked_softmax_attention(d_k, d_v):
    g = gen(1)
    x = torch.randn(3, 17, 5, generator=g, dtype=F64)
    tq, tk = torch.randn(d_k, 5, generator=g, dtype=F64), torch.randn(d_k, 5, generator=g, dtype=F64)
    tv = torch.randn(d_v, 5, generator=g, dtype=F64)
    y = attention.causal_head(x, tq, tk, tv)
    ref = brute_causal_attention(x @ tq.T, x @ tk.T, x @ tv.T)
    assert y.shape == (3, 17, d_v)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)


def test_causal_head_broadcasts_one_head_per_draw():
    g = gen(2)
    x = torch.randn(4, 9, 3, generator=g, dtype=F64)
    th = [torch.randn(4, 3, 3, generator=g, dtype=F64) for _ in range(3)]
    y = attention.causal_head(x, *th)
    for b in range(4):
        torch.testing.assert_close(y[b], attention.causal_head(x[b:b + 1], *(t[b] for t in th))[0])


def test_prefix_head_equals_one_prompt_per_length():
    """Row n-1 of the cumulative-sum readout = the causal head's last output on (x_1..x_n, x_query)."""
    g = gen(3)
    ctx = torch.randn(2, 11, 4, generator=g, dtype=F64)
    query = torch.randn(2, 4, generator=g, dtype=F64)
    tq, tk, tv = (torch.randn(3, 4, generator=g, dtype=F64) for _ in range(3))
    fast = attention.prefix_head(ctx, query, tq, tk, tv)
    for n in range(1, 12):
        prompt = torch.cat([ctx[:, :n], query[:, None]], dim=1)
        torch.testing.assert_close(fast[:, n - 1], attention.causal_head(prompt, tq, tk, tv)[:, -1],
                                   rtol=1e-12, atol=1e-12)


def test_prefix_readout_with_one_self_value_per_prefix():
    g = gen(4)
    scores = torch.randn(2, 6, generator=g, dtype=F64) * 3
    values = torch.randn(2, 6, 3, generator=g, dtype=F64)
    self_score = torch.randn(2, generator=g, dtype=F64)
    self_values = torch.randn(2, 6, 3, generator=g, dtype=F64)
    out = attention.prefix_readout(scores, values, self_score, self_values)
    for n in range(1, 7):
        s = torch.cat([scores[:, :n], self_score[:, None]], 1)
        v = torch.cat([values[:, :n], self_values[:, n - 1:n]], 1)
        torch.testing.assert_close(out[:, n - 1], (torch.softmax(s, -1).unsqueeze(-1) * v).sum(1))


def test_tilted_prefix_means_are_weighted_means():
    g = gen(5)
    x = torch.randn(3, 8, 2, generator=g, dtype=F64)
    tilt = torch.randn(3, 2, generator=g, dtype=F64)
    out = attention.tilted_prefix_means(x, tilt)
    w = torch.exp((x * tilt[:, None]).sum(-1))
    n = 5
    ref = (w[:, :n, None] * x[:, :n]).sum(1) / w[:, :n].sum(1, keepdim=True)
    torch.testing.assert_close(out[:, n - 1], ref)


# -- closed forms against Monte Carlo ---------------------------------------------------------------

def test_gaussian_tilted_mean_has_gamma_one_over_sqrt_dk():
    """Thm 3.2 + Gaussian inputs: m_x(q) = E[x e^{pᵀx/√d_k}] / E[e^{pᵀx/√d_k}] = Σ Θ_Kᵀ q / √d_k."""
    g = gen(6)
    d, d_k = 3, 4
    factor = streams.random_covariance_factor(d, g) + torch.eye(d, dtype=F64)
    sigma = factor @ factor.T
    theta_k = torch.randn(d_k, d, generator=g, dtype=F64) / 2
    q = torch.randn(d_k, generator=g, dtype=F64)
    q = q / closed_forms.tilt_variance(sigma, theta_k, q).sqrt()  # logit variance 1: a tame tilt
    x = streams.gaussian_stream(factor, 400_000, g)[0]
    w = torch.exp(x @ (theta_k.T @ q) / math.sqrt(d_k))
    monte_carlo = (w[:, None] * x).sum(0) / w.sum()
    direction = sigma @ theta_k.T @ q
    gamma = (monte_carlo @ direction) / (direction @ direction)
    assert closed_forms.gamma_gaussian(d_k) == pytest.approx(0.5)
    assert gamma.item() == pytest.approx(closed_forms.gamma_gaussian(d_k), rel=0.02)
    torch.testing.assert_close(monte_carlo, closed_forms.tilted_mean_gaussian(sigma, theta_k, q), atol=0.03, rtol=0)


def test_sigma_wu_matches_the_sampled_tasks():
    """Σ_wu = βᵀ Σ_uu, Monte Carlo over the demonstrations of one App. B.2 task."""
    tasks = streams.icl_tasks(1, 200_000, 5, 2, gen(7))
    u, w = tasks.u[0], tasks.w[0]
    empirical = w.T @ u / len(u)
    exact = closed_forms.sigma_wu(tasks.beta, tasks.sigma_uu)[0]
    torch.testing.assert_close(empirical, exact, atol=0.03, rtol=0)
    diag = torch.diagonal(tasks.sigma_uu[0])
    assert ((diag >= 0.25) & (diag <= 1.0)).all() and torch.equal(tasks.sigma_uu[0], torch.diag(diag))


def test_population_gd_recursion():
    """B^(k+1) = B^(k) − η(B^(k)Σ_uu − Σ_wu): the closed form Σ_wuΣ_uu⁻¹(I − (I − ηΣ_uu)^k), the
    gradient of the empirical loss ½E‖w − Bu‖² (autograd, Monte Carlo), and B^(k) → B* = βᵀ."""
    tasks = streams.icl_tasks(3, 100_000, 4, 2, gen(8))
    s_uu, s_wu = tasks.sigma_uu, closed_forms.sigma_wu(tasks.beta, tasks.sigma_uu)
    eta, k = 0.3, 6
    iterates = gd.population_gd_iterates(s_uu, s_wu, eta, k)
    eye = torch.eye(4, dtype=F64)
    closed = s_wu @ torch.linalg.inv(s_uu) @ (eye - torch.linalg.matrix_power(eye - eta * s_uu, k))
    torch.testing.assert_close(iterates[k], closed, rtol=1e-12, atol=1e-12)
    # one step from B^(3) with the Monte Carlo gradient of the sampled loss
    b = iterates[3].clone().requires_grad_(True)
    loss = 0.5 * ((tasks.w - tasks.u @ b.transpose(-1, -2)) ** 2).sum(-1).mean(-1).sum()
    loss.backward()
    torch.testing.assert_close(iterates[3] - eta * b.grad, iterates[4], atol=0.02, rtol=0)
    far = gd.population_gd_iterates(s_uu, s_wu, 1.0, 200)[-1]
    torch.testing.assert_close(far, tasks.beta.transpose(-1, -2), rtol=1e-8, atol=1e-8)


def test_iid_rate_constant_matches_monte_carlo():
    """n·E‖X̄_n(q) − m_x(q)‖² → e^v (tr Σ + ‖m‖²) for i.i.d. Gaussian inputs (our delta-method form)."""
    g = gen(9)
    d, n, reps = 3, 2000, 3000
    factor = streams.random_covariance_factor(d, g) + 0.5 * torch.eye(d, dtype=F64)
    sigma = factor @ factor.T
    theta_k = torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d)
    q = torch.randn(d, generator=g, dtype=F64)
    q = q * (0.8 / closed_forms.tilt_variance(sigma, theta_k, q)).sqrt()
    x = streams.gaussian_stream(factor, n, g, reps)
    means = attention.tilted_prefix_means(x, (theta_k.T @ q / math.sqrt(d)).expand(reps, d))[:, -1]
    mse = ((means - closed_forms.tilted_mean_gaussian(sigma, theta_k, q)) ** 2).sum(-1).mean()
    assert (n * mse).item() == pytest.approx(closed_forms.iid_rate_constant(sigma, theta_k, q).item(), rel=0.1)


def test_tau_alpha_bound():
    assert closed_forms.tau_alpha_ar1_bound(0.0) == 1.0
    assert closed_forms.tau_alpha_ar1_bound(0.25) == pytest.approx(3.0)  # 1 + 2·0.5/0.5


# -- streams -----------------------------------------------------------------------------------------

def test_linear_recurrence_matches_a_loop():
    e = torch.randn(2, 9, 3, generator=gen(10), dtype=F64)
    ref = e.clone()
    for t in range(1, 9):
        ref[:, t] = 0.7 * ref[:, t - 1] + e[:, t]
    torch.testing.assert_close(streams.linear_recurrence(e, 0.7), ref)


def test_ar1_stream_is_stationary_with_lag_correlation_rho():
    g = gen(11)
    factor = streams.random_covariance_factor(2, g) + torch.eye(2, dtype=F64)
    sigma = factor @ factor.T
    x = streams.ar1_stream(factor, 40, 0.6, g, streams=20_000)
    for t in (0, 39):  # the first and the last position have the same law
        torch.testing.assert_close(x[:, t].T @ x[:, t] / 20_000, sigma, atol=0.1, rtol=0.03)
    lag1 = x[:, 21].T @ x[:, 20] / 20_000
    torch.testing.assert_close(lag1, 0.6 * sigma, atol=0.1, rtol=0.05)


# -- §4: selector heads and the residual stack --------------------------------------------------------

def brute_stack_query(u, w, u_query, eta, layers):
    """Eq. 3 / App. B.2 run literally on one explicit prompt (demonstrations then the query)."""
    d_u = u.shape[-1]
    s_u, s_w = gd.selectors(d_u, w.shape[-1])
    hidden = torch.cat([torch.cat([u, w], -1), torch.cat([u_query, torch.zeros_like(w[0])])[None]], 0)[None]
    for _ in range(layers):
        y = attention.causal_head(hidden, s_u, s_u, s_w)
        hidden = hidden.clone()
        hidden[..., d_u:] -= eta * math.sqrt(d_u) * y
    return -hidden[0, -1, d_u:]


def test_residual_stack_equals_explicit_prompts_for_every_length():
    tasks = streams.icl_tasks(2, 9, 3, 2, gen(12))
    preds = gd.residual_stack_predictions(tasks.u, tasks.w, tasks.u_query, eta=0.3, layers=3)
    assert preds.shape == (4, 2, 9, 2)
    assert torch.count_nonzero(preds[0]) == 0  # ŵ^(0) = −r^(0) = 0 at the query
    for b in range(2):
        for n in (1, 4, 9):
            ref = brute_stack_query(tasks.u[b, :n], tasks.w[b, :n], tasks.u_query[b], 0.3, 3)
            torch.testing.assert_close(preds[3, b, n - 1], ref, rtol=1e-12, atol=1e-12)


def test_one_block_is_eta_times_the_single_head():
    tasks = streams.icl_tasks(3, 7, 4, 2, gen(13))
    s_u, s_w = gd.selectors(4, 2)
    context, query = gd.prompt_tokens(tasks.u, tasks.w, tasks.u_query)
    single = gd.single_head_predictions(context, query, s_u, s_u, s_w)
    stack = gd.residual_stack_predictions(tasks.u, tasks.w, tasks.u_query, eta=0.05, layers=1)
    torch.testing.assert_close(stack[1], 0.05 * single)


def test_single_head_reaches_sigma_wu_u_on_a_long_prompt():
    """Cor. 4.1 in miniature: √d_u y_t → Σ_wu u_t (and the check is not vacuous: not → βᵀu_t)."""
    tasks = streams.icl_tasks(4, 50_000, 3, 2, gen(14), diag_low=0.25, diag_high=1.0)
    s_u, s_w = gd.selectors(3, 2)
    pred = gd.single_head_predictions(*gd.prompt_tokens(tasks.u, tasks.w, tasks.u_query), s_u, s_u, s_w)[:, -1]
    target = (closed_forms.sigma_wu(tasks.beta, tasks.sigma_uu) @ tasks.u_query[..., None])[..., 0]
    bayes = (tasks.beta.transpose(-1, -2) @ tasks.u_query[..., None])[..., 0]
    err = (pred - target).norm(dim=-1) / target.norm(dim=-1)
    assert err.max() < 0.05
    assert ((bayes - target).norm(dim=-1) / target.norm(dim=-1)).max() > 4 * err.max()


# -- §5: the context-free map --------------------------------------------------------------------------

def test_population_covariances_are_those_of_the_context_free_map():
    """Σ_ℓ = Cov(F^(ℓ)(x)) exactly: F^(ℓ) is linear, so its Jacobian J gives J Σ Jᵀ."""
    g = gen(15)
    d = 4
    factor = streams.random_covariance_factor(d, g)
    sigma = factor @ factor.T
    heads = collapse.random_heads(3, d, 3, 0.7, g)
    sigmas = collapse.population_covariances(sigma, heads)
    for layer in range(1, 4):
        jac = collapse.context_free_map(torch.eye(d, dtype=F64), heads[:layer], sigmas[:layer]).T
        torch.testing.assert_close(sigmas[layer], jac @ sigma @ jac.T, rtol=1e-12, atol=1e-12)


def test_stack_forgets_its_context():
    """Thm 5.2 in miniature: late hidden states are far closer to F^(L)(x_t) than early ones."""
    g = gen(16)
    factor = streams.random_covariance_factor(6, g)
    heads = collapse.random_heads(2, 6, 6, 0.5, g)  # small heads: logits well inside Thm 5.2's cone
    x = streams.gaussian_stream(factor, 1024, g, 32)
    hidden = collapse.stack_forward(x, heads)
    f = collapse.context_free_map(x, heads, collapse.population_covariances(factor @ factor.T, heads)[:2])
    err = ((hidden[-1] - f) ** 2).sum(-1).mean(0)
    assert err[900:].mean() < err[50:100].mean() / 5  # 1/t predicts ≈ 12.7


def test_estimated_covariances_pool_the_tail():
    h = torch.randn(5, 300, 2, generator=gen(17), dtype=F64) * torch.tensor([1.0, 3.0], dtype=F64)
    est = collapse.estimate_covariances([h], start=100)[0]
    torch.testing.assert_close(est, torch.cov(h[:, 100:].reshape(-1, 2).T))
    torch.testing.assert_close(torch.diagonal(est), torch.tensor([1.0, 9.0], dtype=F64), rtol=0.15, atol=0)


# -- fitting ---------------------------------------------------------------------------------------------

def test_loglog_fit_recovers_a_power_law():
    n = fitting.geometric_grid(10_000, 30)
    assert n[0] == 1 and n[-1] == 10_000 and (n[1:] > n[:-1]).all()
    slope, constant = fitting.loglog_fit(n, 7.0 / n)
    assert slope == pytest.approx(-1.0) and constant == pytest.approx(7.0)
    xs, ys = fitting.log_binned_means(n, 7.0 / n)
    assert fitting.loglog_fit(xs, ys)[0] == pytest.approx(-1.0, abs=0.02)
