"""Per-matrix inputs (BlockAdapter.input_at): Gemma 4's MoE sizes run a router and experts beside the dense
MLP, each reading its own norm of v. The structural reading gives each of their matrices its own input, the
float64 check holds only with them (the control: every matrix read at the MLP's input is refused), and what
cannot take such a block (the closed loop, App. B, the fixed patch) says so in one line before loading.
The float64 run through the CLI is test_structure.py's, with the other families without an adapter file."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching.arch import tiny
from experiments.patching.arch.check import choose_adapter
from experiments.patching.arch.structure import candidates

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gemma4_moe():
    """(the tiny random Gemma 4 MoE model in float32, the form its check chose)."""
    from transformers import AutoModelForCausalLM

    from experiments.zoo.random_weights import randomize_

    config = tiny.tiny_config("gemma4_text_moe", 300)
    forms = candidates(config)
    torch.manual_seed(0)
    model = randomize_(AutoModelForCausalLM.from_config(config, **forms[0].load_kwargs), 0).eval()
    return model, choose_adapter(model, forms)


def test_the_router_and_experts_beside_the_mlp_read_their_own_inputs(gemma4_moe):
    _model, adapter = gemma4_moe
    assert adapter.input_at == {"router.proj.weight": "router.proj", "experts.gate_up_proj": "experts"}
    assert {"mlp.gate_proj.weight", "mlp.up_proj.weight"} <= set(adapter.input_matrices)
    assert adapter.output_param == "post_feedforward_layernorm.weight"  # after the sum of the two branches
    assert adapter.residual_at == "pre_feedforward_layernorm" and adapter.pre_norm_matrix is None


def test_inputs_read_anywhere_else_fail_the_check(gemma4_moe):
    """The controls: the same form with every matrix given the MLP's z (what the engine did before per-matrix
    inputs) is refused by the float64 check, far above rounding, and so are the experts read at the input of
    their norm (v itself) instead of at their own input, at the check's input step."""
    model, adapter = gemma4_moe
    with pytest.raises(UserError, match=r"the layer's output differs from the with-context one by (\S+)") as err:
        choose_adapter(model, [replace(adapter, input_at={})])
    assert float(err.value.args[0].split("with-context one by ")[1].split()[0]) > 1e-3
    elsewhere = dict(adapter.input_at, **{"experts.gate_up_proj": "pre_feedforward_layernorm_2"})
    with pytest.raises(UserError, match=r"the output of experts still differs by") as err:
        choose_adapter(model, [replace(adapter, input_at=elsewhere)])
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny.save_checkpoint("gemma4_text_moe", tmp_path_factory.mktemp("gemma4_moe") / "gemma4_text_moe")


@pytest.mark.parametrize("variant", ["closed_loop", "stable"])
def test_the_closed_loop_and_app_b_are_refused_in_one_line_before_loading(folder, variant, icl, tmp_path):
    r = icl("run", "patch_match", "preset=smoke", f"variant={variant}", f"model={folder}",
            f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, r.stderr
    assert f"variant={variant} " in errors[0] and "read their own inputs beside the MLP" in errors[0]
    assert "router.proj.weight, experts.gate_up_proj" in errors[0] and errors[0].endswith("use variant=naive")
    assert not (tmp_path / "run").exists()


def test_every_variant_but_the_open_loop_is_refused_for_the_per_matrix_inputs_themselves(gemma4_moe):
    """Without Gemma 4's layer scalar (which refuses them too), per-matrix inputs alone refuse the closed
    loops and App. B, and the fixed patch; naive stays."""
    from experiments.patching.fixed_patch import check_fixed_patch
    from experiments.patching.variants import VARIANTS, check_variant

    adapter = replace(gemma4_moe[1], output_scale=None, sum_at=None)
    for name in VARIANTS:
        if name == "naive":
            assert check_variant(adapter, name).name == "naive"
            continue
        with pytest.raises(UserError, match="read their own inputs beside the MLP"):
            check_variant(adapter, name)
    with pytest.raises(UserError, match="the fixed patch fits every input matrix from the MLP's inputs"):
        check_fixed_patch(adapter)
    check_fixed_patch(replace(adapter, input_at={}))  # the control: without them, no refusal


def test_the_fixed_patch_is_refused_in_one_line_before_loading(folder, icl, tmp_path):
    r = icl("run", "context_compile", "preset=smoke", f"model={folder}", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "the fixed patch fits every input matrix from the MLP's inputs" in errors[0], r.stderr
    assert not (tmp_path / "run").exists()


def test_modules_beside_the_mlp_that_read_its_output_fail_the_stand_in_step(gemma4_moe, monkeypatch):
    """The control of the check's step 4: the same Gemma 4 layer with its router and experts reading v plus the
    MLP's branch (not v). Step 2 refuses it first (its patched MLP moves what they read); with steps 1–3 passed
    over, step 4 alone refuses it too, naming the input an alone pass whose MLP answers by a kept output would
    read wrong. The stock layer passes all four (the fixture)."""
    import inspect
    import textwrap

    import transformers.models.gemma4.modeling_gemma4 as gemma4

    from experiments.patching.arch import check

    source = textwrap.dedent(inspect.getsource(gemma4.Gemma4TextDecoderLayer.forward))
    stock = "hidden_states_flat = residual.reshape(-1, residual.shape[-1])"
    assert stock in source  # the line this control changes is where it was
    namespace: dict = {}
    exec(source.replace(stock, "hidden_states_flat = (residual + hidden_states_1).reshape(-1, residual.shape[-1])"),
         vars(gemma4), namespace)
    monkeypatch.setattr(gemma4.Gemma4TextDecoderLayer, "forward", namespace["forward"])
    model, adapter = gemma4_moe
    with pytest.raises(UserError, match=r"the output of router\.proj still differs"):
        choose_adapter(model, [replace(adapter)])  # a new adapter: the stock one's check is remembered
    monkeypatch.setattr(check, "_compare", lambda *args: None)
    with pytest.raises(UserError, match=r"answering by kept outputs, z@router\.proj differs") as err:
        choose_adapter(model, [replace(adapter)])
    assert "\n" not in str(err.value)
