"""Two ways to apply a patch and two ways to advance the text (patch_match's `apply=` and `advance=`).

apply=action keeps W and adds the rank-1 update's action c (vᵀz) to the module's output by a hook; apply=
materialized writes W + ΔW rounded. In float64 the two are the same linear map to rounding, reached by
different code (factors and hooks against a written matrix), on a Linear block (Llama), a Conv1D block
(GPT-2: the transposed storage) and App. B's steps (Gemma 3: the pre-norm matrix read back through the
action). advance=patched feeds the patched model's token: its patched tokens must be what `patched_generate`
(the patched model alone, its own code path) emits."""

from __future__ import annotations

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching.generate import compare_generation, patched_generate
from experiments.patching.load import load_checked
from experiments.patching.patcher import Patcher
from experiments.zoo.prompts import encode_prompt
from tests.helpers.cli import assert_one_line_error

PROMPT = "Write a haiku about the first snow of winter."
CPU = torch.device("cpu")


def patched_logits(model_name: str, variant: str, apply: str, dtype=torch.float64, tokens: int = 3):
    bundle = load_checked(model_name, dtype, CPU, seed=0)
    inputs = encode_prompt(bundle, PROMPT, device=CPU)
    patcher = Patcher(bundle.model, variant, apply)
    steps = list(compare_generation(patcher, inputs, tokens, control=False))
    params = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    return torch.stack([s.patched.logits for s in steps]), torch.stack([s.context for s in steps]), bundle, params


@pytest.mark.parametrize("model_name, variant", [("tiny-llama", "naive"), ("tiny-gpt2", "naive"),
                                                 ("tiny-gemma3", "stable"), ("tiny-gemma3", "conditioned")])
def test_the_action_and_the_written_weights_are_the_same_map_in_float64(model_name, variant):
    action, context, bundle, before = patched_logits(model_name, variant, "action")
    written, context_again, _, _ = patched_logits(model_name, variant, "materialized")
    assert torch.equal(context, context_again)  # the same with-context side
    scale = written.abs().max()
    assert float((action - written).abs().max() / scale) <= 1e-12
    # the action left the model's weights as they were (its hooks removed, nothing written)
    after = dict(bundle.model.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in before.items())
    assert not any(m._forward_hooks for m in bundle.model.modules())


def test_the_action_is_computed_in_the_models_dtype():
    """In bfloat16 the kept factors are bfloat16 (what the hook adds is computed in the model's dtype), and
    no patched matrix is written: only vectors (none on Llama's rule) would be."""
    bundle = load_checked("tiny-llama", torch.bfloat16, CPU, seed=0)
    inputs = encode_prompt(bundle, PROMPT, device=CPU)
    patcher = Patcher(bundle.model, "naive", "action")
    next(compare_generation(patcher, inputs, 1, control=False))
    actions = patcher.open_loop_actions()
    assert actions and all(a.coef.dtype == a.vec.dtype == torch.bfloat16 for a in actions.values())
    assert not any(t.dim() >= 2 for bufs in patcher.layer_bufs for t in bufs.tensors.values())


def test_advance_patched_follows_the_patched_models_own_tokens():
    """tiny-gpt2's naive open loop misses (learned positions): its patched tokens part from the context's,
    so following one or the other gives different texts, and following the patched one gives exactly the
    tokens of `patched_generate`."""
    bundle = load_checked("tiny-gpt2", torch.float32, CPU, seed=0)
    inputs = encode_prompt(bundle, PROMPT, device=CPU)
    own = [g.token_id for g in patched_generate(Patcher(bundle.model, "naive"), inputs, 6)]
    followed = list(compare_generation(Patcher(bundle.model, "naive"), inputs, 6, control=False, advance="patched"))
    assert [s.patched_token_id for s in followed] == own
    context_led = list(compare_generation(Patcher(bundle.model, "naive"), inputs, 6, control=False))
    assert [s.token_id for s in context_led] != [s.patched_token_id for s in context_led]  # it does miss
    with pytest.raises(ValueError, match="advance='sideways'"):
        next(compare_generation(Patcher(bundle.model, "naive"), inputs, 1, advance="sideways"))


def test_the_action_is_refused_where_it_is_not_defined():
    bundle = load_checked("tiny-llama", torch.float32, CPU, seed=0)
    with pytest.raises(UserError, match="for the open loop"):
        Patcher(bundle.model, "closed_loop", "action")
    with pytest.raises(UserError, match="apply='sideways' is not one of materialized, action"):
        Patcher(bundle.model, "naive", "sideways")
    moe = load_checked("tiny-mixtral", torch.float32, CPU, seed=0)
    with pytest.raises(UserError, match="stacked experts"):
        Patcher(moe.model, "naive", "action")


@pytest.mark.parametrize("overrides, fragment", [
    (["apply=acton"], "did you mean apply=action?"),
    (["advance=patchd"], "did you mean advance=patched?"),
    (["apply=action", "variant=closed_loop"], "apply=action is for the open loop"),
    (["apply=action", "model=tiny-mixtral"], "stacked experts (MoE)"),
])
def test_bad_apply_or_advance_is_one_line_before_any_model(icl_inprocess, tmp_path, overrides, fragment):  # noqa: F811
    proc = icl_inprocess("run", "patch_match", "preset=smoke", "model=tiny-llama", *overrides,
                         f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_line_error(proc, fragment)
    assert not (tmp_path / "run").exists()


def test_layer_errors_measures_the_action_like_the_written_weights_in_float64(icl_inprocess, tmp_path):  # noqa: F811
    """layer_errors with apply=action: the patched layers' gains and the one-ulp sensitivity run with the
    actions hooked; in float64 they equal the written weights' (other code), and the claims say `_action`."""
    import pandas as pd

    runs = {}
    for apply in ("materialized", "action"):
        proc = icl_inprocess("run", "layer_errors", "preset=smoke", "model=tiny-llama", "dtypes=[float64]",
                             "variants=[naive]", f"apply={apply}", f"hydra.run.dir={tmp_path / apply}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[apply] = pd.read_csv(tmp_path / apply / "metrics.csv")
    values = {(k, name): runs[k][runs[k]["metric"] == name]["value"].to_numpy()
              for k in runs for name in ("gain_patched", "one_ulp_patched", "hidden_rel")}
    a, m = values["action", "gain_patched"], values["materialized", "gain_patched"]
    assert len(a) == len(m) > 0 and abs(a - m).max() <= 1e-9 * abs(m).max()  # an O(1) gain, the same map
    for name in ("one_ulp_patched", "hidden_rel"):  # both at float64's rounding level with either
        assert len(values["action", name]) and abs(values["action", name]).max() < 1e-12
    claims = pd.read_csv(tmp_path / "action" / "claims.csv")
    mine = claims[~claims["id"].str.startswith("goldwaser.record.")]  # (the with-context side's: no variant)
    assert mine["id"].str.contains("naive_action_float64").all() and claims["passed"].all()
