"""Each Xu & Fang claim given a broken input that a weaker check would pass: it must fail, while the real
input passes (or fails honestly, as the README reports)."""

from __future__ import annotations

from omegaconf import OmegaConf

from experiments.core.results import RunContext
from tests.helpers.in_process import run_claims

# the smoke preset's stack, with the cpu preset's prompt length so the real stack reaches the 0.95 bar
STACK = ("single.max_demos=64", "single.tasks=16", "stack.max_demos=1024", "claims.few_hundred=300")
STACK_IDS = ["xu_fang.prop4_4.stack_cos", "xu_fang.prop4_4.stack_exact_at_few_hundred"]


def test_stack_cosines_fail_for_a_one_block_stack(tmp_path, monkeypatch):
    """η = 0.01: the 8-step and the 1-step targets point the same way (cos 0.99999), so a 1-block stack
    cleared the whole-output cosine bar (0.960) as well as the 8-block one (0.967). The claims now read
    what blocks 2..8 add, which a 1-block stack (blocks 2..8 passing ŵ through) does not."""
    import torch

    from experiments.xu_fang.cov_icl_gd import run as cov_icl_gd

    real = run_claims("cov_icl_gd", tmp_path / "real", *STACK)
    assert real.loc["xu_fang.prop4_4.stack_cos", "passed"]
    assert real.loc["xu_fang.prop4_4.stack_exact_at_few_hundred", "measured"] > 0.9
    stack = cov_icl_gd.residual_stack_predictions

    def one_block(u, w, u_query, eta, layers):
        out = stack(u, w, u_query, eta, 1)  # ŵ^(0), ŵ^(1)
        return torch.cat([out, out[1:].expand(layers - 1, *out.shape[1:])])

    monkeypatch.setattr(cov_icl_gd, "residual_stack_predictions", one_block)
    broken = run_claims("cov_icl_gd", tmp_path / "one_block", *STACK)
    assert not broken.loc[STACK_IDS, "passed"].any()
    assert broken.loc["xu_fang.prop4_4.stack_rel_mse", "measured"] > 0.5  # the MSE tells them apart too


def _rate(variant: str, rho: float, d: int, trace: float, constant: float, iid: float) -> dict:
    return dict(variant=variant, rho=rho, d=d, trace=trace, constant=constant, iid_constant=iid, slope=-1.0)


def _growth_claims(tmp_path, rho_constants, dim_constants):
    from experiments.xu_fang.cov_rate.run import check_claims

    cfg = OmegaConf.create({"fit_min_n": 64, "claims": {"slope_tolerance": 0.1, "constant_tolerance": 0.1,
                                                        "growth_tolerance": 0.35}})
    rows = [_rate("rho", rho, 16, 16.0, c, 16.0) for rho, c in zip((0.0, 0.5, 0.8), rho_constants, strict=True)]
    rows += [_rate("dim", 0.0, d, float(d), c, c) for d, c in zip((4, 16, 64), dim_constants, strict=True)]
    ctx = RunContext(run_dir=tmp_path, experiment="cov_rate", run_id="r")
    check_claims(ctx, cfg, rows)
    return ctx.claims().set_index("id").loc[["xu_fang.thm3_6.constant_grows_with_tau",
                                             "xu_fang.thm3_6.constant_grows_with_trace"], "passed"]


def test_growth_claims_judge_the_predicted_size(tmp_path):
    # the predicted growth: (1+ρ)/(1−ρ) = 1, 3, 9 and tr Σ = 4, 16, 64
    assert _growth_claims(tmp_path, (16.0, 48.0, 144.0), (4.0, 16.0, 64.0)).all()
    # no growth (the old bar of 1 was this)
    assert not _growth_claims(tmp_path, (16.0, 16.0, 16.0), (4.0, 4.0, 4.0)).any()
    # growth of the right sign but a tenth of the size: the old claims passed it
    assert not _growth_claims(tmp_path, (16.0, 17.6, 19.4), (4.0, 4.4, 4.8)).any()
