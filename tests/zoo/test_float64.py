"""float64 end to end: a float64 model's rotary inverse frequencies are float64, its logits are compared in
float64, and a difference near 1e-12 is logged as such, not as 0 or as a float32 rounding."""

from __future__ import annotations

import pytest
import torch

from experiments.patching.compare import comparable, logit_comparison
from experiments.patching.load import load_checked
from experiments.zoo.float64 import float64_inv_freq

pytestmark = pytest.mark.usefixtures("one_thread")


def _rotaries(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama"])
def test_rotary_inverse_frequencies_are_computed_in_float64(name):
    """Against Python's own double-precision pow (an independent computation), element by element; the stored
    buffer is float32-rounded and differs."""
    model = load_checked(name, torch.float64, "cpu", seed=0).model
    for rotary in _rotaries(model):
        config = rotary.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        for prefix, table in rotary.inv_freq64.items():
            rope = config.rope_parameters[prefix[:-1]] if prefix else config.rope_parameters
            base = float(rope["rope_theta"])
            expected = torch.tensor([1.0 / base ** (i / head_dim) for i in range(0, head_dim, 2)], dtype=torch.float64)
            assert table.dtype == torch.float64
            torch.testing.assert_close(table, expected, rtol=4e-16, atol=0)
            assert not torch.equal(getattr(rotary, f"{prefix}inv_freq").double(), table)  # what was replaced
            layer_type = (prefix[:-1],) if prefix else ()
            cos, _ = rotary(torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[1000]]), *layer_type)
            angle = 1000 * table  # position 1000: cos computed from the float64 frequencies
            torch.testing.assert_close(cos[0, 0], torch.cat([angle, angle]).cos(), rtol=0, atol=1e-15)


def test_llama3_and_linear_rope_types_and_an_unknown_one():
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)
    inv = float64_inv_freq(rope, 64)
    plain = float64_inv_freq(dict(rope_type="default", rope_theta=500000.0), 64)
    assert inv[0] == plain[0] and inv[-1] == plain[-1] / 32.0  # high frequencies kept, low ones divided
    assert float64_inv_freq(dict(rope_type="linear", rope_theta=1e4, factor=8.0), 16).mul(8.0).equal(
        float64_inv_freq(dict(rope_type="default", rope_theta=1e4), 16))
    assert float64_inv_freq(dict(rope_type="yarn", rope_theta=1e4, factor=4.0), 16) is None


def test_a_float64_difference_near_1e_12_is_logged_as_such():
    reference = torch.tensor([3.0, 1.0, -2.0], dtype=torch.float64)
    other = reference.clone()
    other[1] += 3e-12
    assert comparable(other).dtype == torch.float64 and comparable(other.bfloat16()).dtype == torch.float32
    rel = logit_comparison(reference, comparable(other))["logit_linf_rel"]
    assert rel == pytest.approx(1e-12, rel=1e-3)
    # two logits 4e-16 apart straddling a float32 rounding boundary: float32 would make them 6e-8 apart
    a = torch.tensor([1.0 + 2.0**-24 - 2.0**-52], dtype=torch.float64)
    b = torch.tensor([1.0 + 2.0**-24 + 2.0**-52], dtype=torch.float64)
    assert logit_comparison(comparable(a), comparable(b))["logit_linf"] < 1e-15
    assert logit_comparison(a.float(), b.float())["logit_linf"] > 1e-8  # what `.float()` made of it


def test_a_float64_patched_pass_logs_float64_differences():
    """End to end on a float64 model: the patched pass's logits are float64, and its difference from the
    with-context logits is at float64 rounding, logged as a nonzero number far below float32's."""
    from experiments.patching.generate import compare_generation
    from experiments.patching.patcher import Patcher
    from experiments.zoo.prompts import encode_prompt

    bundle = load_checked("tiny-llama", torch.float64, "cpu", seed=0)
    steps = list(compare_generation(Patcher(bundle.model, "naive"), encode_prompt(bundle, "Hi there."), 3))
    rel = [logit_comparison(st.context, st.patched.logits)["logit_linf_rel"] for st in steps]
    assert all(st.patched.logits.dtype == torch.float64 and st.context.dtype == torch.float64 for st in steps)
    assert max(rel) < 1e-12 and max(rel) > 0.0


def test_soft_capped_attention_runs_eagerly_with_its_softmax_in_float64():
    """Gemma 2 soft-caps its attention logits, which SDPA refuses: a float64 model of it runs eager attention's
    formula with the softmax in float64 (`EAGER_FLOAT64`). Against the formula written out in float64 (an
    independent computation) it agrees to rounding; the control, transformers' own eager attention, rounds its
    softmax to float32 and differs by far more. The whole model runs under it, causal mask included."""
    from transformers import AutoModelForCausalLM
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    from experiments.patching.arch import tiny
    from experiments.zoo.float64 import EAGER_FLOAT64, _eager_float64_attention, exact_float64_

    torch.manual_seed(0)
    config = tiny.tiny_config("gemma2", 300)
    model = exact_float64_(AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval())
    assert model.config._attn_implementation == EAGER_FLOAT64
    attention = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(0)
    q, k, v = (8 * torch.randn(1, heads, 5, 16, generator=gen, dtype=torch.float64) for heads in (4, 2, 2))
    mask = torch.full((5, 5), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)[None, None]
    scale, cap = 16 ** -0.5, 50.0
    keys, values = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    logits = cap * torch.tanh(q @ keys.transpose(2, 3) * scale / cap) + mask
    written = (torch.softmax(logits, dim=-1) @ values).transpose(1, 2)
    ours = _eager_float64_attention(attention, q, k, v, mask, scaling=scale, softcap=cap)[0]
    theirs = eager_attention_forward(attention, q, k, v, mask, scaling=scale, softcap=cap)[0]
    assert float((ours - written).abs().max()) < 1e-13
    assert float((theirs - written).abs().max()) > 1e-9  # float32's softmax
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, -1]
        prefix = model(input_ids=ids[:, :3]).logits[0, -1]
        again = model(input_ids=ids[:, :3]).logits[0, -1]
    assert torch.equal(prefix, again) and not torch.allclose(full, prefix)
    with torch.no_grad():  # causal: the last token does not change what the first three see
        assert torch.allclose(model(input_ids=ids).logits[0, 2], prefix, rtol=1e-12, atol=1e-12)
