"""Table 1 on a trained model whose output rule is a matrix: the real Qwen2.5-Coder 0.5B (model=qwen2.5-0.5b,
Thm 9's W_down), conftest's session fixture `qwen32`. Algorithm 1's open loop holds here, at every layer, where
on Gemma 3 270M (Thm 10's post-MLP scale) it is O(1) off by the last layer (tests/goldwaser/test_real_gemma.py):
Thm 9 divides by ‖y‖, not by MLP outputs near 0 (docs/models.md)."""

from __future__ import annotations

import pytest
import torch

from experiments.patching.compare import logit_comparison
from experiments.patching.generate import compare_generation
from experiments.patching.patcher import Patcher
from experiments.zoo.prompts import encode_prompt

pytestmark = pytest.mark.numeric  # float32 rounding-level bounds: CI runs them again under another kernel set
PROMPT = "List three reasons why octopuses are considered intelligent animals."


def test_algorithm1_open_loop_float32_is_at_rounding_level_at_every_layer_and_the_control_is_not(qwen32):
    inputs = encode_prompt(qwen32, PROMPT)
    before = qwen32.model(**inputs).logits[0, -1]
    for st in compare_generation(Patcher(qwen32.model, "naive"), inputs, 2, stock_at=lambda step: step == 0):
        patched = logit_comparison(st.context, st.patched.logits)
        control = logit_comparison(st.context, st.control.logits)
        # measured: hidden 3-9e-7 at every layer, no growth; logits ~2e-6 (Gemma 270M naive: O(1), tenfold a layer)
        assert max(st.patched.hidden_rel) < 1e-5, st.patched.hidden_rel
        assert st.patched.hidden_rel[-1] < 10 * st.patched.hidden_rel[0] + 1e-6, st.patched.hidden_rel
        assert st.token_id == st.patched_token_id and patched["logit_linf_rel"] < 1e-4, patched
        assert control["logit_linf_rel"] > 1e3 * patched["logit_linf_rel"], control  # the context matters
        if st.stock is not None:  # the patched weights in the model's own parameters, its stock forward
            assert logit_comparison(st.context, st.stock)["logit_linf_rel"] < 1e-4
    assert torch.equal(qwen32.model(**inputs).logits[0, -1], before)  # the parameters restored bit for bit


def test_the_open_loop_batched_across_layers_is_the_per_layer_path_bit_for_bit(qwen32):
    """Issue 54 item 3 on trained weights: every layer's W_gate and W_up patched by one call over stacked weights
    (batch_layers=inputs) gives the per-layer path's patched tensors, per-layer errors and logits bit for bit, from the
    same with-context step. The stack is undone after (the session's model as it was, each weight its own storage)."""
    from tests.helpers.batched import per_layer_and_batched

    def stacked(patcher):
        assert sorted(patcher.layer_stack.stacks) == ["mlp.gate_proj.weight", "mlp.up_proj.weight"]

    a, b = per_layer_and_batched(qwen32, PROMPT, "inputs", stacked)
    assert a.tensors.keys() == b.tensors.keys()
    assert all(torch.equal(a.tensors[name], b.tensors[name]) for name in a.tensors)
    assert torch.equal(a.logits, b.logits)
    assert a.hidden_linf == b.hidden_linf and max(a.hidden_rel) < 1e-5
