"""Each architecture adapter on its tiny random transformers model: the patched model fed the query
token alone (its own forward, patched weights) against the model with the context, in float64, with
the unpatched no-context control beside it; and the errors a user sees."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching.arch import TINY_MODELS, adapter_for
from experiments.patching.compare import logit_comparison
from experiments.patching.families import FAMILY_TABLE, post_norm_names
from experiments.patching.generate import compare_generation, patched_generate
from experiments.patching.load import TINY_ARCHITECTURES, load_checked
from experiments.patching.patcher import Patcher
from experiments.patching.variants import VARIANTS, check_variant, export_default
from experiments.zoo.prompts import encode_prompt

# rounding-level bounds: CI runs them again under another CPU kernel set; one thread (tests/conftest.py)
pytestmark = [pytest.mark.numeric, pytest.mark.usefixtures("one_thread")]

PROMPT = "Write a haiku about the first snow of winter."


@functools.cache
def _bundle(name: str, dtype: torch.dtype):
    return load_checked(name, dtype, "cpu", seed=0)


def _steps(name, dtype, variant, n=6):
    b = _bundle(name, dtype)
    return list(compare_generation(Patcher(b.model, variant), encode_prompt(b, PROMPT), n))


# Gemma's RMSNorm computes in float32 whatever the model dtype: its float64 level is float32's.
LEVEL = {"tiny-gemma3": 1e-5}


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_closed_loop_float64_is_exact_by_construction_and_so_is_its_last_layer_control(name):
    """The closed loop solves each layer for the with-context output: exact by design. Its control, the same
    solve at the last layer alone, reaches the same logits from hidden states far from the record at every
    other layer: logit agreement of a closed loop is no evidence; its per-layer error against the record is
    what tells them apart. The unpatched model without the context is far off on both counts."""
    steps = _steps(name, torch.float64, "closed_loop")
    for st in steps:
        cmp = logit_comparison(st.context, st.patched.logits)
        last = logit_comparison(st.context, st.last_layer.logits)
        ctrl = logit_comparison(st.context, st.control.logits)
        assert cmp["logit_linf_rel"] < LEVEL.get(name, 1e-10), (name, st.step, cmp)
        assert last["logit_linf_rel"] < LEVEL.get(name, 1e-10), (name, st.step, last)
        assert max(st.patched.hidden_rel) < LEVEL.get(name, 1e-10)
        assert min(st.last_layer.hidden_rel[:-1]) > 1e-3 and st.last_layer.hidden_rel[-1] < LEVEL.get(name, 1e-10)
        assert ctrl["logit_linf"] > 0.1 and min(st.control.hidden_rel) > 1e-3  # without a patch: far off
        assert st.patched.routing_changed == 0
    assert sum(logit_comparison(st.context, st.control.logits)["top1_match"] for st in steps) < len(steps)


def _broken(step, generator):
    """The solvers' targets of every layer but the last replaced by random vectors of the same norm (a
    layer's output and the next layer's input alike); the record is left alone."""
    targets = step.targets
    for index in range(len(targets) - 1):
        out = targets[index].values["out"]
        fake = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.dtype)
        fake = fake * (out.norm() / fake.norm())
        targets[index].values["out"] = fake
        targets[index + 1].values["x_in"] = fake.clone()
    return step


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_broken_targets_show_in_every_variants_errors_against_the_record(name):
    """The audit's broken input: wrong targets for every layer but the last. The closed loop still reaches
    the with-context logits (one layer forces any output: a construction), but its per-layer error against
    the independent record is O(1) where the targets were wrong; the open loop is wrong everywhere."""
    b = _bundle(name, torch.float64)
    ids = encode_prompt(b, PROMPT)["input_ids"]
    for variant in ("closed_loop", "naive"):
        patcher = Patcher(b.model, variant)
        cache = patcher.prefill({"input_ids": ids[:, :-1]})
        step = _broken(patcher.context_step({"input_ids": ids[:, -1:]}, cache), torch.Generator().manual_seed(0))
        result = patcher.patched_pass(ids[:, -1:], step)
        # what was broken: the closed loop aims layers 0..L-2 at wrong outputs; the open loop patches layers
        # 1..L-1 for wrong inputs
        broken = result.hidden_rel[:-1] if variant == "closed_loop" else result.hidden_rel[1:]
        assert min(broken) > 1e-2, (name, variant, result.hidden_rel)
        rel = logit_comparison(step.logits, result.logits)["logit_linf_rel"]
        if variant == "closed_loop":
            assert rel < LEVEL.get(name, 1e-10), (name, rel)  # forced by the last layer alone
        else:
            assert rel > 1e-3, (name, rel)


@pytest.mark.parametrize("name", [n for n in TINY_ARCHITECTURES if n != "tiny-gpt2"])
def test_naive_algorithm1_float64_is_exact_where_the_token_alone_enters_as_in_the_context(name):
    # Gemma: the naive Δm = r ⊘ f_C multiplies its RMSNorm's float32 rounding by max |Δm| (open loop)
    level = {"tiny-gemma3": 1e-3}.get(name, 1e-9)
    for st in _steps(name, torch.float64, "naive", 4):
        assert logit_comparison(st.context, st.patched.logits)["logit_linf_rel"] < level, name


def test_naive_on_gpt2_misses_because_the_token_alone_sits_at_position_0():
    """GPT-2 adds a learned position embedding at the input: the token alone enters layer 0 as
    wte + wpe[0], not the with-context wte + wpe[T] that open-loop Algorithm 1 patched for. The closed
    loop patches for the input it really gets (test above); the open loop is measured off."""
    steps = _steps("tiny-gpt2", torch.float64, "naive", 4)
    assert max(st.patched.hidden_rel[0] for st in steps) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_closed_loop_pass_is_the_stock_forward_of_the_patched_weights(name, dtype):
    """The closed loop writes each layer's tensors from hooks inside that layer's forward; the pass must
    still be exactly the forward of a model holding those weights: the stock model with them loaded,
    fed the query alone, gives the same logits bit for bit. The unpatched model (control) does not."""
    b = _bundle(name, dtype)
    patcher = Patcher(b.model, "closed_loop")
    ids = encode_prompt(b, PROMPT)["input_ids"]
    cache = patcher.prefill({"input_ids": ids[:, :-1]})
    caps = patcher.context_step({"input_ids": ids[:, -1:]}, cache)
    keep: dict = {}
    result = patcher.patched_pass(ids[:, -1:], caps, keep=keep)
    model = copy.deepcopy(b.model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, t in keep.items():
            params[k].copy_(t)
        stock = model(input_ids=ids[:, -1:], use_cache=False).logits[0, -1].float()
    assert torch.equal(stock, result.logits)
    assert not torch.equal(patcher.control_logits(ids[:, -1:]), result.logits)


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_context_targets_from_the_decoder_body_are_the_full_models_bits(name):
    """patched_generate's with-context step skips the LM head: every recorded value must be unchanged."""
    b = _bundle(name, torch.float32)
    patcher = Patcher(b.model, "closed_loop")
    ids = encode_prompt(b, PROMPT)["input_ids"]
    full, body = ([c.values for c in patcher.context_step({"input_ids": ids}, None, logits=flag).targets]
                  for flag in (True, False))
    assert [sorted(v) for v in full] == [sorted(v) for v in body]
    flat = lambda t: t if isinstance(t, tuple) else (t,)  # noqa: E731
    for f, g in zip(full, body, strict=True):
        for key, t in f.items():
            assert all(x is y is None or torch.equal(x, y) for x, y in zip(flat(t), flat(g[key]), strict=True)), key


@pytest.mark.parametrize("name", TINY_ARCHITECTURES)
def test_patched_generation_without_the_context_emits_the_stock_with_context_tokens(name):
    """The paper's headline, end to end in float32: the patched model, fed only its own tokens, generates
    what stock `generate` generates with the context; the unpatched model without it (control) does not.
    Patched by the open loop that is exact on the block (evidence), the closed loop only for GPT-2, where
    learned absolute positions leave no open loop exact (a construction)."""
    b = _bundle(name, torch.float32)
    inputs = encode_prompt(b, PROMPT)
    n = 8
    variant = export_default(adapter_for(b.model.config.model_type))
    patched = [t.token_id for t in patched_generate(Patcher(b.model, variant), inputs, n)]
    with torch.no_grad():
        stock = b.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        alone = b.model.generate(input_ids=inputs["input_ids"][:, -1:], max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
    assert patched == stock[0, -n:].tolist()
    assert alone[0, -n:].tolist() != patched


def closed_loop_parameters(adapter) -> set[str]:
    """What the closed loop changes in a layer: every input matrix, the output rule's parameter and, before a
    post-MLP norm, W_down (so that Thm 10 divides by ±1)."""
    return {*adapter.input_matrices, adapter.output_param, *filter(None, [adapter.pre_norm_matrix])}


def test_patched_tensors_are_the_adapters_parameters_in_the_model_dtype():
    for name in TINY_ARCHITECTURES:
        names = closed_loop_parameters(TINY_MODELS[name])
        b = _bundle(name, torch.bfloat16)
        patcher = Patcher(b.model, "closed_loop")
        ids = encode_prompt(b, PROMPT)["input_ids"]
        cache = patcher.prefill({"input_ids": ids[:, :-1]})
        caps = patcher.context_step({"input_ids": ids[:, -1:]}, cache)
        keep: dict = {}
        patcher.patched_pass(ids[:, -1:], caps, keep=keep)
        assert {k.split(".", 3)[-1] for k in keep} == names, name
        assert all(t.dtype == torch.bfloat16 for t in keep.values())
        params = dict(b.model.named_parameters())
        assert all(k in params and params[k].shape == t.shape for k, t in keep.items())


def test_unsupported_architecture_and_inapplicable_variant_are_one_line():
    with pytest.raises(UserError, match="model_type 'bert' has no context-patching adapter; supported: .*gemma3.*gpt2"):
        adapter_for("bert")
    have = ", ".join(sorted(post_norm_names()))  # Gemma 3, OLMo 2
    only = rf"variant=stable \(App. B\) needs a post-MLP norm, which Llama does not have \(only {have}\)"
    with pytest.raises(UserError, match=only):
        check_variant(adapter_for("llama"), "stable")
    with pytest.raises(UserError, match="variant=closed_loop_scale .* GPT-2 has no post-MLP norm"):
        check_variant(adapter_for("gpt2"), "closed_loop_scale")
    with pytest.raises(UserError, match="variant='fast' is not one of naive, stable"):
        check_variant(adapter_for("llama"), "fast")
    for family in FAMILY_TABLE:  # App. B's variants are offered by the post-norm blocks
        if family.post_norm:
            for variant in ("stable", "conditioned", "closed_loop_scale"):
                check_variant(adapter_for(family.model_types[0]), variant)


def test_export_defaults_to_an_exact_open_loop_and_to_the_closed_loop_only_without_one():
    """Conditioned before a post-MLP norm, naive elsewhere; the closed loop only under learned absolute
    positions (GPT-2), where the query alone is at another position and no open loop is exact."""
    for family in FAMILY_TABLE:
        adapter = adapter_for(family.model_types[0])
        want = ("closed_loop" if adapter.absolute_positions else "conditioned" if family.post_norm else "naive")
        assert export_default(adapter) == want, family.name
        assert VARIANTS[want].evidence == (want != "closed_loop")
    assert {export_default(adapter_for(f.model_types[0])) for f in FAMILY_TABLE} == {"conditioned", "naive",
                                                                                      "closed_loop"}
