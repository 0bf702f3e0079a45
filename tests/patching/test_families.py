"""Families as a user brings them: a checkpoint folder (config, weights and a tokenizer, as save_pretrained
writes them) given as model=PATH. Qwen 3, Phi-3 (fused gate/up) and GPT-NeoX (parallel residual, and the
sequential variant the same adapter reads) patch exactly in float64 through the CLI; OLMo 1 and Granite,
which have no adapter file, are read from their module trees (Granite's branch scaled by its
residual_multiplier, which the output rule absorbs) and pass the check against their stock layers; a
structural guess that misses the scale is refused in one line naming the layer, the form and what differed;
and adapters broken on purpose are refused by the same check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching.arch import STRUCTURAL, gpt_neox, llama, phi3, qwen3
from experiments.patching.arch.base import tiny_common
from experiments.patching.arch.check import check_adapter
from tests.helpers.checkpoints import assert_patched_exactly, checkpoint_folders, float64_open_loop

pytestmark = pytest.mark.usefixtures("one_thread")


def olmo1_config(vocab_size: int):
    from transformers import OlmoConfig

    return OlmoConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, **tiny_common(vocab_size))


def granite_config(vocab_size: int):
    """Llama's layer and names, but T = v + 0.5 · MLP(z): Thm 9's W_down update moves T by r / 2."""
    from transformers import GraniteConfig

    return GraniteConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=4096, residual_multiplier=0.5,
                         **tiny_common(vocab_size))


def sequential_neox_config(vocab_size: int):
    config = gpt_neox.tiny_config(vocab_size)
    config.use_parallel_residual = False
    return config


CHECKPOINTS = {"qwen3": qwen3.tiny_config, "phi3": phi3.tiny_config, "gpt_neox": gpt_neox.tiny_config,
               "gpt_neox_sequential": sequential_neox_config, "olmo": olmo1_config, "granite": granite_config}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny random model saved with the byte tokenizer, as a user's checkpoint folder."""
    from transformers import AutoModelForCausalLM

    from experiments.zoo.random_weights import randomize_

    def build(name: str, vocab: int):
        torch.manual_seed(0)
        return randomize_(AutoModelForCausalLM.from_config(CHECKPOINTS[name](vocab)), 0)

    return checkpoint_folders(tmp_path_factory.mktemp("checkpoints"), CHECKPOINTS, build)


@pytest.mark.numeric  # float64 at rounding level: CI runs it again under another CPU kernel set
def test_qwen3_phi3_gpt_neox_and_structural_olmo_and_granite_patch_exactly_through_the_cli(folders, icl, tmp_path):
    names = ["qwen3", "phi3", "gpt_neox", "gpt_neox_sequential", "olmo", "granite"]
    runs = float64_open_loop(icl, folders, names, tmp_path / "sweep")
    for name, m in runs.items():
        assert_patched_exactly(m, name, 1e-10)
        assert m["model"].iloc[0] == str(folders[name])
    assert "structural (olmo)" in runs["olmo"]["family"].iloc[0]


def test_a_structural_guess_that_misses_the_branch_scale_is_refused_in_one_line(folders):
    """Granite read as if its config did not say residual_multiplier = 0.5: every form fails the check, and
    the line names the layer, the first form tried and the difference."""
    from transformers import AutoModelForCausalLM

    from experiments.patching.arch.check import choose_adapter
    from experiments.patching.arch.structure import candidates

    forms = [replace(form, branch_scale=1.0) for form in candidates(granite_config(300))]
    assert all(f.branch_scale == 1.0 for f in forms) and candidates(granite_config(300))[0].branch_scale == 0.5
    model = AutoModelForCausalLM.from_pretrained(folders["granite"]).eval()
    with pytest.raises(UserError) as err:
        choose_adapter(model, forms)
    line = str(err.value)
    assert "\n" not in line and line.startswith("model_type 'granite': the structural (granite) adapter does not "
                                                "describe its decoder layer 0 (GraniteDecoderLayer): its output is "
                                                "not v + the output of mlp (relative difference")
    assert "(form tried: Thm 7 + Thm 9 (outer weight); v read at the input of post_attention_layernorm" in line
    assert line.endswith("no form of Table 1 fits it; refused")
    choose_adapter(model, candidates(granite_config(300)))  # the control: with the scale it holds


def test_a_scaled_branch_is_taken_by_the_open_loop_only(folders, icl, tmp_path):
    r = icl("run", "patch_match", "preset=smoke", "variant=closed_loop", f"model={folders['granite']}",
            f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "variant=closed_loop solves for T = v + g" in errors[0], r.stderr
    assert "scales its branch by 0.5; use variant=naive" in errors[0]
    assert not (tmp_path / "run").exists()


WRONG = {
    "an input matrix left out": (dict(input_matrices={"mlp.gate_proj.weight": "linear"}),
                                 r"with mlp\.gate_proj\.weight updated to read z_C \(Thm 7\), the MLP's output still"),
    "the residual read at the wrong norm": (dict(residual_at="input_layernorm"), r"its output is not v \+ the output"),
    "another matrix as the output rule's": (dict(output_param="mlp.up_proj.weight",
                                                 captures={"y": ("mlp.up_proj", "input")}),
                                            "the output of mlp.up_proj has 128 features, the residual 64"),
    "a parameter the layer lacks": (dict(input_matrices={"mlp.fc_in.weight": "linear"}),
                                    "it has no parameter 'mlp.fc_in.weight'"),
}


@pytest.mark.parametrize("wrong", WRONG)
def test_a_deliberately_wrong_adapter_is_refused_in_one_line(wrong):
    from experiments.patching.load import load_checked

    model = load_checked("tiny-llama").model  # its own adapter passed the same check on the way (the control)
    change, says = WRONG[wrong]
    with pytest.raises(UserError, match=says) as err:
        check_adapter(model, replace(llama.ADAPTER, **change))
    assert "\n" not in str(err.value) and "the Llama adapter does not describe its decoder layer 0" in str(err.value)


def test_a_pure_state_space_model_is_refused_before_loading_for_want_of_an_mlp():
    """Mamba's block is a norm and a mixer, nothing after it: no MLP to absorb the context, one line."""
    from transformers import MambaConfig

    from experiments.patching.load import require

    config = MambaConfig(hidden_size=64, state_size=8, num_hidden_layers=2, **tiny_common(300))
    with pytest.raises(UserError, match="model_type 'mamba' has no context-patching adapter and its module tree fits "
                                        r"no form of Table 1: its token mixer \(mixer\) has no MLP after it: the "
                                        "theorem needs an MLP after the mixer") as err:
        require(config)
    assert "\n" not in str(err.value)
    assert "mamba" not in STRUCTURAL


def test_the_check_runs_the_layer_where_the_layer_is():
    """On a GPU the check's random inputs must be on the layer's device (made on the CPU they refused every
    model: "its forward failed in float64"). No second real device here: the meta device stands in, where the
    forward runs on shapes alone and only the comparison of values cannot."""
    from experiments.patching.arch import check
    from experiments.patching.load import load_checked

    def to_meta(value):
        if isinstance(value, torch.Tensor):
            return value.to("meta")
        if isinstance(value, tuple | list):
            return type(value)(to_meta(v) for v in value)
        return {k: to_meta(v) for k, v in value.items()} if isinstance(value, dict) else value

    model = load_checked("tiny-llama").model
    layers = llama.ADAPTER.layers(model)
    args, kwargs = check._layer_calls(model, layers, [0])[0]
    why = check._check_layer(layers[0].to("meta"), llama.ADAPTER, to_meta(args), to_meta(kwargs))
    assert why is not None and "forward failed" not in why and "meta tensors" in why, why
