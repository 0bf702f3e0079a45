"""factorization (App. E) end to end through the CLI at preset=smoke, asserting on its CSVs."""


import pandas as pd
import pytest
import torch

from experiments.data.linreg import sample_prompts
from experiments.dherin.dynamics import suffix_contextual_outputs
from experiments.dherin.factorization.run import factorization_errors, reversed_products
from experiments.dherin.models.linreg import attention_block

FIGURE = "figE_factorization"
EXPERIMENT = "factorization"  # the shared smoke run (tests/helpers/smoke_runs.py)
N, TASKS = 20, 12  # the smoke preset's context length and task count


def test_draws_the_papers_figure(smoke_run):
    """The paper's figure by name (every figure is checked drawn, with its PDF, by the contract test)."""
    assert (smoke_run / "figures" / f"{FIGURE}.png").is_file()


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_every_step_keeps_the_output_and_the_product_form_holds(smoke_run, dtype, tol):
    m = pd.read_csv(smoke_run / "metrics.csv")
    m = m[m.dtype == dtype]

    def curve(name):
        rows = m[m.metric == name].sort_values("tokens_consumed")
        assert rows.tokens_consumed.tolist() == list(range(N + 1)), name  # i = 0..n, every step
        return rows.value.to_numpy()

    assert curve("eq28_max_abs_err").max() < tol
    assert curve("eq28_control_unpatched")[1:].min() > 1e-4  # without the patch the output moves
    assert curve("eq31_max_abs_err").max() < tol
    assert curve("eq31_control_reversed")[2:].min() > 1e-4  # the factors do not commute
    steps = m[m.metric == "step_norm_op2"]
    assert len(steps) == TASKS * N and steps.task.nunique() == TASKS
    fro = m[m.metric == "step_norm_fro"].value.to_numpy()
    assert (steps.value.to_numpy() <= fro * (1 + 1e-6)).all()
    # W_n is not Cor. 2.5.1's W_0 + ΔW(C), though both absorb the whole context
    assert m[m.metric == "wn_vs_eq2_patch_max_abs"].value.iloc[0] > 1e-4


def test_claims_are_measured(smoke_run):
    c = pd.read_csv(smoke_run / "claims.csv")
    exact = c[c.id.str.startswith(("dherin.eq28.", "dherin.eq31."))]
    assert len(exact) == 8 and exact.passed.all(), exact[["id", "measured", "tolerance"]]
    assert {"dherin.eq31.product_form", "dherin.eq31.product_form_float64"} <= set(c.id)  # run dtype: plain id
    f64 = c.set_index("id").loc["dherin.eq31.product_form_float64"]
    assert f64.measured < 1e-12


def test_reversed_products_multiply_in_reverse():
    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(5, 3, generator=g, dtype=torch.float64)
    F = torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)
    R = reversed_products(W0, F)
    assert R.shape == (2, 5, 5, 3)
    for b in range(2):
        torch.testing.assert_close(R[b, 0], W0)
        torch.testing.assert_close(R[b, 4], W0 @ F[b, 3] @ F[b, 2] @ F[b, 1] @ F[b, 0])


def _model(seed):
    torch.manual_seed(seed)
    return attention_block(2, d_model=8, n_heads=2, d_mlp=16).double()


def test_eq31_is_judged_by_forward_passes_and_fails_on_wrong_suffix_outputs():
    """The product form run by a forward pass must give the with-context output. With another model's
    suffix outputs S_i the factors are wrong and the claim fails, while the old check (product vs the
    recursion built from the same S_i) still passes: associativity holds for any S."""
    model = _model(0)
    tokens = sample_prompts(4, 6, 2, torch.Generator().manual_seed(0), dtype=torch.float64).tokens
    r = factorization_errors(model, tokens)
    assert r["eq31_max_abs_err"].max() < 1e-12 and r["eq28_max_abs_err"].max() < 1e-12
    assert r["eq31_control_reversed"][2:].min() > 1e-6
    wrong = suffix_contextual_outputs(_model(1).contextual, tokens)
    bad = factorization_errors(model, tokens, a_suffix=wrong)
    assert bad["eq31_max_abs_err"].max() > 1e-3 and bad["eq28_max_abs_err"].max() > 1e-3
    assert bad["eq31_product_vs_recursion_max_abs"].max() < 1e-12  # the old claim would have passed
