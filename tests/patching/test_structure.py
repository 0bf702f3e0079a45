"""Blocks described by their module tree (patching/arch/structure.py), chosen by the float64 check: the
families with adapter files read the same from their trees; newer families with no file (OLMo 3, Qwen3-MoE,
Qwen3-Next's gated linear attention and shared expert, LFM2's short convolutions, Gemma 4 with and without
its experts, gpt-oss's experts with biases, Gemma 2's soft-capped attention, Falcon's `self_attention` in both
its blocks) patch exactly in float64 through the CLI as checkpoint folders; OPT (no MLP module) is read by
role and, with learned absolute positions, patched exactly by the closed loop only, as GPT-2; what no form fits
is one line; `icl-exp models` lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from experiments.core.errors import UserError
from experiments.patching.arch import FAMILIES, STRUCTURAL, adapter_for, tiny
from experiments.patching.arch.check import choose_adapter, describe
from experiments.patching.arch.structure import candidates
from experiments.patching.compare import rounding_bar
from tests.helpers.checkpoints import assert_patched_exactly, checkpoint_folders, float64_open_loop

pytestmark = pytest.mark.usefixtures("one_thread")

# what an adapter says about its block; `decoder` is compared by the module it returns
FIELDS = ("layers_attr", "mlp", "input_matrices", "output_rule", "output_param", "residual_at", "attention",
          "captures", "pre_norm_matrix", "scale_offset", "absolute_positions", "load_kwargs", "input_at")


def tiny_model(config, load_kwargs: dict | None = None):
    from transformers import AutoModelForCausalLM

    from experiments.zoo.random_weights import randomize_

    torch.manual_seed(0)
    return randomize_(AutoModelForCausalLM.from_config(config, **(load_kwargs or {})), 0).eval()


@pytest.mark.parametrize("adapter", FAMILIES, ids=lambda a: a.family)
def test_a_family_with_an_adapter_file_reads_the_same_from_its_module_tree(adapter):
    config = adapter.tiny_config(300)
    forms = candidates(config)
    model = tiny_model(config, adapter.load_kwargs)
    chosen = choose_adapter(model, forms)
    assert {f: getattr(chosen, f) for f in FIELDS} == {f: getattr(adapter, f) for f in FIELDS}
    assert chosen.decoder(model) is adapter.decoder(model)
    # the control: the forms tried before the chosen one are refused by the same check (it does choose)
    for form in forms[: forms.index(chosen)]:
        with pytest.raises(UserError):
            choose_adapter(model, [form])


NEW = {"olmo3": "Thm 10", "qwen3_moe": "Thm 11", "qwen3_next": "Thm 11", "lfm2": "Thm 9", "gemma4_text": "Thm 10",
       "gemma4_text_per_layer": "Thm 10", "gemma4_text_moe": "Thm 10", "gpt_oss": "Thm 11 with Thm 8",
       # found by role: Gemma 2's post-norms (eager attention for its soft-capping), Falcon's mixer by what its
       # forward takes (named `self_attention`), in its 7B block (one LayerNorm) and its 40B/180B one (two)
       "gemma2": "Thm 7 + Thm 10", "falcon": "Thm 12", "falcon_new_decoder": "Thm 12"}
# a size -> its model_type
SIZES = {"gemma4_text_per_layer": "gemma4_text", "gemma4_text_moe": "gemma4_text", "falcon_new_decoder": "falcon"}


def as_trained(model):
    """What random_weights leaves at its initial value drawn too: biases (gpt-oss's router and experts then
    show that the input update leaves a bias alone and that each active expert's outer bias absorbs r / S on
    top of its own) and Gemma 4's layer scalars (1 at initialization; the patch must not need T = v + g)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and "norm" not in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.fill_(0.5 + float(torch.rand((), generator=gen)))
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each family's tiny random model saved with the byte tokenizer, as a user's checkpoint folder."""
    return checkpoint_folders(tmp_path_factory.mktemp("structural"), NEW,
                              lambda name, vocab: as_trained(tiny_model(tiny.tiny_config(name, vocab))))


@pytest.mark.numeric  # float64 at rounding level: CI runs it again under another CPU kernel set
def test_newer_families_without_adapter_files_patch_exactly_in_float64_through_the_cli(folders, icl, tmp_path):
    """Algorithm 1's open loop (naive) on blocks read from their trees: the patched model's own forward of the
    query alone gives the with-context logits to float64 rounding, also where the token mixer is a gated
    linear attention (Qwen3-Next) or a short convolution (LFM2): the patch never reads the mixer; and where the
    layer goes on after v + g with the token's own data (Gemma 4's per-layer inputs and layer scalar): the
    query alone brings the same data, and the patch makes v + g what it was after the context; and where
    a router and experts beside the MLP read their own norms of v (Gemma 4's MoE sizes): each matrix's
    input update reads its own input. Judged by the witness's uncached forward of the whole sequence: Qwen3-Next's
    gated delta rule and its gated norm compute in float32 in transformers (`.to(torch.float32)`), so its
    float64 run is float32 there and its uncached prompt forward (chunked) and the cached step (recurrent)
    round apart at ~3e-6: bounded by float32's bar, a known float32 island, not float64's."""
    float32_islands = {"qwen3_next": 1e-4}
    for name, m in float64_open_loop(icl, folders, list(NEW), tmp_path / "sweep").items():
        assert_patched_exactly(m, name, float32_islands.get(name, rounding_bar("float64")))
        assert m["family"].iloc[0] == f"structural ({SIZES.get(name, name)})"


def test_the_chosen_form_is_the_one_table_1_row_the_block_needs():
    chosen = {}
    for name, theorem in NEW.items():
        config = tiny.tiny_config(name, 300)
        forms = candidates(config)
        chosen[name] = choose_adapter(tiny_model(config, forms[0].load_kwargs), forms)
        assert theorem in chosen[name].theorem, (name, chosen[name].theorem)
    # Qwen3-Next's shared expert and its gate read z too: they get the input update; the routed experts absorb r
    shared = {"mlp.shared_expert.up_proj.weight", "mlp.shared_expert_gate.weight"}
    assert shared <= set(chosen["qwen3_next"].input_matrices)
    assert chosen["qwen3_next"].output_param == "mlp.experts.down_proj"


def test_roles_not_names_find_the_mixer_and_the_mlp():
    """Falcon's attention is `self_attention`, OPT has no MLP module (fc1 and fc2 hang on the layer), Gemma 2
    soft-caps its attention logits: the forms are read from what each part does, and the one chosen says so."""
    chosen = {}
    for name in ("falcon", "falcon_new_decoder", "opt", "gemma2"):
        config = tiny.tiny_config(name, 300)
        forms = candidates(config)
        chosen[name] = choose_adapter(tiny_model(config, forms[0].load_kwargs), forms)
    for name in ("falcon", "falcon_new_decoder"):  # a parallel block: v = x + the attention's output (Thm 12)
        assert chosen[name].attention == "self_attention" and chosen[name].residual_at is None, name
        assert chosen[name].input_matrices == {"mlp.dense_h_to_4h.weight": "linear"}
    opt = chosen["opt"]
    assert (opt.mlp, opt.input_matrices, opt.output_param, opt.residual_at) == (
        "fc1", {"fc1.weight": "linear"}, "fc2.bias", "final_layer_norm")
    assert opt.absolute_positions and "learned absolute positions" in describe(opt)
    assert chosen["gemma2"].load_kwargs == {"attn_implementation": "eager"}  # SDPA refuses soft-capping
    assert chosen["gemma2"].scale_offset == 1.0 and chosen["gemma2"].post_norm_block


@pytest.mark.numeric
def test_opt_patches_exactly_by_the_closed_loop_and_its_open_loop_misses_for_its_learned_positions(tmp_path):
    """OPT, as GPT-2 (tests/patching/test_arch.py): the closed loop reaches the with-context logits to float64
    rounding (a construction; the export's default), and the open loop misses at layer 0, because the query
    alone enters at position 0 of the learned position table, not after its context (Table 1's premise):
    said, not hidden. The control, the token alone unpatched, is far off."""
    from experiments.patching.compare import logit_comparison
    from experiments.patching.generate import compare_generation
    from experiments.patching.load import load_checked
    from experiments.patching.patcher import Patcher
    from experiments.patching.variants import export_default
    from experiments.zoo.prompts import encode_prompt

    folder = tiny.save_checkpoint("opt", tmp_path / "opt")
    bundle = load_checked(str(folder), torch.float64, "cpu", seed=0)
    adapter = adapter_for("opt")
    assert adapter.family == "structural (opt)" and export_default(adapter) == "closed_loop"
    inputs = encode_prompt(bundle, "Write a haiku about the first snow of winter.")
    closed = list(compare_generation(Patcher(bundle.model, "closed_loop"), inputs, 3))
    errors = [logit_comparison(st.context, st.patched.logits)["logit_linf_rel"] for st in closed]
    assert max(errors) < rounding_bar("float64"), errors
    assert min(logit_comparison(st.context, st.control.logits)["logit_linf"] for st in closed) > 0.1
    naive = list(compare_generation(Patcher(bundle.model, "naive"), inputs, 3))
    assert min(st.patched.hidden_rel[0] for st in naive) > 1e-3  # layer 0 already: another position's input


@pytest.mark.parametrize(("name", "line"), [
    # Falcon-H1: a state-space mixer beside the attention, both adding to the residual
    ("falcon_h1", r"its decoder layer has 2 candidates for the mixer, modules that mix positions \(mamba "
                  r"\(FalconH1Mixer\), self_attn \(FalconH1Attention\)\): which one a parallel block adds to v, or "
                  "which the MLP follows, is undecided"),
    # Granite 4's hybrid: an MoE and a shared MLP, both reading the layer's norm
    ("granitemoehybrid", r"its decoder layer has 2 candidates for the MLP, weighted paths that do not mix positions "
                         r"\(block_sparse_moe \(GraniteMoeHybridMoE\), shared_mlp \(GraniteMoeHybridMLP\)\)"),
])
def test_a_layer_with_two_candidates_for_one_role_is_one_line_before_any_run_folder(name, line, tmp_path):
    """Which part mixes positions, or which reads z, the tree cannot decide: one line naming the candidates,
    from the config alone (nothing loaded), exit 2 and no run folder."""
    from tests.helpers.in_process import refusal

    folder = tmp_path / name
    tiny.tiny_config(name, 300).save_pretrained(folder)  # the refusal comes before any weight is read
    text = refusal("patch_match", tmp_path / "run", f"model={folder}", "dtype=float64")
    assert re.search(f"model_type '{name}' has no context-patching adapter and its module tree fits no form of "
                     f"Table 1: {line}", text), text
    assert name not in STRUCTURAL


def test_a_position_mixer_inside_the_mlp_is_refused_naming_it():
    """A convolution inside the MLP (no stock family has one: the tree is built here) reads other positions'
    z: Thm 7 needs the query's alone, so the tree is refused, naming the module, before the check is tried.
    The control: the same tree with a width-1 convolution (it mixes no positions) is read."""
    from types import SimpleNamespace

    from torch import nn

    from experiments.patching.arch.structure import NoForm, read_tree

    class MLP(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.up_proj, self.down_proj = nn.Linear(16, 32), nn.Linear(32, 16)
            self.conv = nn.Conv1d(32, 32, width, groups=32)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.o_proj = nn.Linear(16, 16)

        def forward(self, hidden_states, attention_mask=None):
            return self.o_proj(hidden_states)

    def tree(width: int) -> nn.Module:
        layer = nn.Module()
        layer.self_attn, layer.mlp, layer.norm = Attention(), MLP(width), nn.LayerNorm(16)
        model = nn.Module()
        model.layers = nn.ModuleList([layer])
        return model

    config = SimpleNamespace(num_hidden_layers=1, hidden_size=16)
    with pytest.raises(NoForm, match=r"its MLP candidate mlp holds a module that mixes positions and is not the "
                                     r"layer's mixer \(mlp.conv, Conv1d\)"):
        read_tree(tree(4), config)
    reading = read_tree(tree(1), config)
    assert (reading.mixer, reading.mlp, reading.outer) == ("self_attn", "mlp", "mlp.down_proj.weight")


def test_layers_with_different_mlps_are_refused_in_one_line_saying_why():
    """DeepSeek-V3's first layers are dense, the rest sparse: each needs its own output rule, and the engine
    holds one adapter per model; the line says so, before anything is loaded."""
    from experiments.patching.load import require

    with pytest.raises(UserError, match=r"its decoder layers have different MLPs \(DeepseekV3MLP .*DeepseekV3MoE .*"
                                        "the engine patches every layer through one adapter") as err:
        require(tiny.tiny_config("deepseek_v3", 300))
    assert "\n" not in str(err.value)


def test_each_active_experts_bias_moves_the_mixture_by_r():
    """Thm 8 inside Thm 11 on random tensors in float64: Σ_j g_j Δb_j = r for any gates; the control, the
    same Δb with the gates of other experts (not renormalized), misses r by far more than rounding."""
    from experiments.patching.rules.moe_bias import moe_bias_updates

    gen = torch.Generator().manual_seed(0)
    r = torch.randn(64, generator=gen, dtype=torch.float64)
    gates = torch.rand(3, generator=gen, dtype=torch.float64)
    delta = moe_bias_updates(r, gates)
    assert torch.allclose(gates @ delta, r, rtol=1e-13, atol=1e-13)
    other = torch.rand(3, generator=gen, dtype=torch.float64)
    assert float((other @ delta - r).abs().max()) > 1e-3


def test_icl_exp_models_lists_families_with_their_status_and_caches_them(icl, tmp_path, monkeypatch):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    r = icl("models", "llama", "olmo3", "mamba")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines()[:3])
    assert lines["llama"].startswith("adapter file") and "Thm 9" in lines["llama"]
    assert lines["olmo3"].startswith("module tree") and "Thm 10" in lines["olmo3"]
    assert lines["mamba"].startswith("refused") and "the theorem needs an MLP after the mixer" in lines["mamba"]
    assert "checking olmo3" in r.stderr
    cached = list((tmp_path / "cache" / "families").glob("transformers-*.json"))
    assert len(cached) == 1
    again = icl("models", "olmo3")
    assert again.returncode == 0 and "checking" not in again.stderr and again.stdout.startswith("olmo3")
    bad = icl("models", "olmo4")
    assert bad.returncode == 2 and bad.stderr.strip() == ("error: model_type 'olmo4' has no causal-LM class in the "
                                                          "installed transformers; did you mean 'olmo'?")


def test_icl_exp_models_out_keeps_the_table_and_its_record_and_the_page_counts_are_written_from_them(icl, tmp_path,
                                                                                                  monkeypatch):
    """`icl-exp models --out DIR` (how results/models is kept): the printed table as survey.csv, where it came from as
    survey.json; docs/models.md's counts and results/README.md's line are written from them."""
    import json

    import pandas as pd

    from experiments.core.results_root import manifest_text
    from experiments.patching.survey_record import page_table

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results" / "models"
    r = icl("models", "llama", "mamba", "--out", str(out))
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out / "survey.csv")
    assert table["model_type"].tolist() == ["llama", "mamba"]
    assert table["status"].tolist() == ["adapter file", "refused"]
    record = json.loads((out / "survey.json").read_text())
    assert record["families"] == 2 and record["computed"] == 2 and record["complete"] is False
    assert record["transformers"] and record["host"]["cores"] and record["wall_time_s"] >= 0
    page = page_table([out])
    assert "| by an adapter file | 1 |" in page and "| refused (the line says why) | 1 |" in page
    assert "(those asked) | 2 |" in page
    assert "| no MLP after the mixer | 1 | `mamba` |" in page  # why each refused family is refused
    assert "`models/survey.csv` is not a run" in manifest_text(tmp_path / "results", [])
    again = icl("models", "llama", "mamba", "--out", str(out))  # from the cache: the record says so
    assert again.returncode == 0 and json.loads((out / "survey.json").read_text())["computed"] == 0
    assert "0 of 2 answers computed" in page_table([out])


def test_the_experts_biases_fit_k_positions_exactly_up_to_the_number_of_experts():
    """The fixed patch's version of the same rule: A Δb = R (A: each position's gates over the E experts) is
    exact for k ≤ E positions with independent gate rows; past E it is least squares (the control)."""
    from experiments.patching.rules.moe_bias import MixtureOfExpertBiases

    gen = torch.Generator().manual_seed(0)
    E, d = 4, 16
    P = torch.zeros(E, d, dtype=torch.float64)

    def fit(k: int) -> float:
        index = torch.stack([torch.randperm(E, generator=gen)[:2] for _ in range(k)])
        weights = torch.rand(k, 2, generator=gen, dtype=torch.float64)
        R = torch.randn(k, d, generator=gen, dtype=torch.float64)
        _delta, moved = MixtureOfExpertBiases().fit_positions(None, None, P, (None, index, weights), {}, R)
        return float((moved - R).abs().max() / R.abs().max())

    assert fit(3) < 1e-12
    assert fit(8) > 1e-3


def test_a_saved_tiny_checkpoint_of_a_family_without_a_file_loads_as_a_users_folder(tmp_path):
    """What docs/goldwaser.md's Table 1 sweep passes as model=FOLDER: the family is read from its tree."""
    from experiments.patching.arch import adapter_for
    from experiments.patching.load import load_checked

    folder = tiny.save_checkpoint("olmo3", tmp_path / "olmo3")
    bundle = load_checked(str(folder), torch.float32, torch.device("cpu"), seed=0)
    assert adapter_for(bundle.model.config.model_type).family == "structural (olmo3)"
    assert bundle.tokenizer("ab")["input_ids"]


def test_the_closed_loop_is_refused_beside_a_shared_expert_and_the_open_loop_is_not():
    """Qwen3-Next's MLP adds a shared expert to its routed experts: the closed loop's in-pass solve of the
    experts does not see it (it missed a quarter of the tokens), so it is one line; naive stays."""
    from experiments.patching.variants import check_variant

    config = tiny.tiny_config("qwen3_next", 300)
    forms = candidates(config)
    adapter = choose_adapter(tiny_model(config, forms[0].load_kwargs), forms)
    for variant in ("closed_loop", "closed_loop_last"):
        with pytest.raises(UserError, match="shared expert"):
            check_variant(adapter, variant)
    assert check_variant(adapter, "naive").name == "naive"
