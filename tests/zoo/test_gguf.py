"""model=gemma-3-270m, model=qwen2.5-0.5b and model=PATH.gguf: a GGUF converted once into a cached checkpoint,
and every way that can go wrong ending in one line with nothing half-written in the cache. The bad chunk
packages are small stand-ins (tests/zoo/fake_chunks.py) found through importlib.metadata like the real ones."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.core.errors import UserError
from experiments.patching.load import CATALOG
from experiments.zoo import bundled_gguf, gguf
from experiments.zoo.bundled_gguf import BUNDLED, GEMMA_270M
from tests.helpers.bundled import require_bundled
from tests.zoo.fake_chunks import install_chunks, tiny_gguf

QUIET = dict(progress=lambda _line: None)


@pytest.fixture(scope="module")
def bundled_gguf_file() -> Path:
    """The registry's Gemma GGUF, assembled into the user's cache (once per machine, as a user's first run does)."""
    require_bundled(GEMMA_270M.name)
    return bundled_gguf.joined_gguf(GEMMA_270M, **QUIET)


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_the_bundled_gguf_is_assembled_and_checked(bundled_gguf_file):
    import hashlib

    assert bundled_gguf_file.name == GEMMA_270M.gguf_name
    assert bundled_gguf_file.stat().st_size == GEMMA_270M.size
    chunks = bundled_gguf.chunk_paths(GEMMA_270M)
    digest = hashlib.sha256()
    for chunk in chunks:  # the chunks as installed, joined here again: the cached file is exactly them
        digest.update(chunk.read_bytes())
    assert digest.hexdigest() == GEMMA_270M.sha256


# -- the chunk packages: a table row pointed at small stand-ins ---------------------------------------------
@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(install(data, ...) -> a BUNDLED row named fake-model for chunks of `data`, the cache folder)."""
    site, cache = tmp_path / "site", tmp_path / "cache"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ICL_EXP_CACHE", str(cache))

    def install(data: bytes, **kw):
        model = install_chunks(site, data, **kw)
        monkeypatch.setitem(BUNDLED, model.name, model)
        return model

    return SimpleNamespace(install=install, site=site, cache=cache, tmp=tmp_path)


def refused(name: str, match: str) -> str:
    with pytest.raises(UserError, match=match) as err:
        gguf.checkpoint_folder(name, **QUIET, catalog=CATALOG)  # patching's: what can be patched
    assert "\n" not in str(err.value)
    return str(err.value)


def test_good_chunks_are_joined_into_the_cache(fake):
    """The control for the refusals below: the same stand-ins, undamaged, are joined and cached."""
    data = tiny_gguf(fake.tmp / "tiny.gguf")
    model = fake.install(data)
    joined = bundled_gguf.joined_gguf(model, **QUIET)
    assert joined.read_bytes() == data and joined.parent.parent.parent == fake.cache


def test_a_corrupted_chunk_fails_the_checksum_and_caches_nothing(fake):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"))
    chunk = fake.site / model.chunks[1][1]
    blob = bytearray(chunk.read_bytes())
    blob[0] ^= 0xFF  # same size, one byte changed
    chunk.write_bytes(bytes(blob))
    assert "sha256" in refused(model.name, "fails its sha256 check.*nothing was cached.*--force-reinstall")
    assert files_under(fake.cache) == []


def test_a_checksum_mismatch_is_one_line_and_caches_nothing(fake, monkeypatch):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"))
    monkeypatch.setitem(BUNDLED, model.name, replace(model, sha256="0" * 64))  # chunks intact, the pin differs
    refused(model.name, "sha256")
    assert files_under(fake.cache) == []


def test_a_truncated_chunk_is_named_before_anything_is_read(fake):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"))
    chunk = fake.site / model.chunks[2][1]
    chunk.write_bytes(chunk.read_bytes()[:-7])
    line = refused(model.name, r"is \d+ bytes where its package recorded \d+ \(truncated")
    assert "part03.bin" in line and "fake-gguf-part3==0.9.0" in line
    assert files_under(fake.cache) == []


def test_a_gguf_of_another_architecture_is_refused_before_it_is_cached(fake):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf", architecture="llama"))  # the row says qwen2
    refused(model.name, "declares architecture 'llama', not 'qwen2'; nothing was cached")
    assert files_under(fake.cache) == []


def test_a_missing_chunk_package_names_the_extra(fake, monkeypatch):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"))
    monkeypatch.setitem(BUNDLED, model.name, replace(model, chunks=(*model.chunks, ("fake-gguf-part9", "x.bin"))))
    refused(model.name, r"needs the chunk package fake-gguf-part9==0.9.0.*pip install -e '\.\[qwen\]'")
    assert files_under(fake.cache) == []


def test_another_version_of_a_chunk_package_is_refused(fake, monkeypatch):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"), version="0.9.1")
    monkeypatch.setitem(BUNDLED, model.name, replace(model, version="0.9.0"))
    refused(model.name, r"fake-gguf-part1 is version 0.9.1; its checksum is known for 0.9.0 only")


def test_without_the_gguf_package_the_line_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # import now raises ImportError
    with pytest.raises(UserError, match=r"model=qwen2.5-0.5b needs the 'gguf' package: pip install -e '\.\[qwen\]'"):
        gguf.checkpoint_folder("qwen2.5-0.5b", **QUIET)
    assert files_under(tmp_path) == []


def test_an_unwritable_cache_is_one_line(fake, monkeypatch):
    model = fake.install(tiny_gguf(fake.tmp / "tiny.gguf"))
    monkeypatch.setenv("ICL_EXP_CACHE", "/proc/icl-exp-cache")  # not writable, even by root
    refused(model.name, "cannot write the model cache .*nothing was cached.*ICL_EXP_CACHE")


# -- model=PATH.gguf -------------------------------------------------------------------------------------
def test_a_truncated_gguf_is_one_line_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    whole = tiny_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) // 2])
    refused(str(cut), "cannot read the GGUF")
    assert files_under(tmp_path / "cache") == []


def test_a_gguf_of_an_architecture_transformers_cannot_build_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    tiny_gguf(tmp_path / "encoder.gguf", architecture="bert")
    refused(str(tmp_path / "encoder.gguf"), "a GGUF of architecture 'bert', which transformers cannot load.*supported:")
    assert files_under(tmp_path / "cache") == []


def test_an_architecture_without_an_adapter_whose_tree_fits_no_form_is_refused(tmp_path, monkeypatch):
    from experiments.patching import arch
    from experiments.patching.arch import structure

    def no_form(_config):
        raise structure.NoForm("its decoder layer has no MLP")

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delitem(arch.ADAPTERS, "llama")  # as if the GGUF held an architecture we cannot patch
    monkeypatch.setattr(structure, "candidates", no_form)
    tiny_gguf(tmp_path / "other.gguf", architecture="llama")
    refused(str(tmp_path / "other.gguf"), "a GGUF of architecture 'llama': model_type 'llama' has no "
                                          "context-patching adapter and its module tree fits no form of Table 1: "
                                          "its decoder layer has no MLP; with an adapter file: .*gemma")
    assert files_under(tmp_path / "cache") == []


def test_an_architecture_without_an_adapter_file_takes_the_structural_route(tmp_path, monkeypatch):
    """The control: the same GGUF, its block read from its module tree, passes the gate before conversion (the
    forms go on trial; the check on the loaded model picks one)."""
    from experiments.patching import arch

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delitem(arch.ADAPTERS, "llama")
    monkeypatch.delitem(arch.STRUCTURAL, "llama", raising=False)
    tiny_gguf(tmp_path / "other.gguf", architecture="llama")
    gguf._check_architecture(tmp_path / "other.gguf", "other.gguf", "", CATALOG)
    assert arch.STRUCTURAL.pop("llama")[0].family == "structural (llama)"


def test_a_failure_while_converting_leaves_no_half_written_folder(tmp_path, monkeypatch):
    """The folder only ever appears complete: a crash mid-write (here: the disk full at the tokenizer) removes
    the staging folder, and the next run starts clean."""
    import transformers

    from experiments.core import atomic

    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    calls = []
    model = SimpleNamespace(config=SimpleNamespace(model_type="llama"), hf_quantizer=None)
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
    tiny_gguf(tmp_path / "copy.gguf", architecture="llama")
    refused(str(tmp_path / "copy.gguf"), "No space left on device.*nothing was cached")
    assert files_under(tmp_path / "cache") == []


@pytest.mark.parametrize("kind", ["not a gguf", "bert"])
def test_the_cli_gives_one_line_and_no_run_folder_for_a_bad_gguf(icl, tmp_path, monkeypatch, kind):
    monkeypatch.setenv("ICL_EXP_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "bad.gguf"
    if kind == "bert":
        tiny_gguf(bad, architecture="bert")
    else:
        bad.write_bytes(b"not a gguf at all")
    out = tmp_path / "run"
    r = icl("run", "patch_match", f"model={bad}", "preset=smoke", f"hydra.run.dir={out}")
    assert r.returncode == 2, r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    expected = "cannot read the GGUF" if kind == "not a gguf" else "architecture 'bert'"
    assert len(lines) == 1 and expected in lines[0], lines
    assert not out.exists() and files_under(tmp_path / "cache") == []
