"""Files are written with the user's umask (colleagues on a shared box can read the results),
not with the 0600 of the temp file they are written through."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from experiments.core.atomic import write_atomic, write_json_atomic, write_text_atomic


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    os.umask(old)
    yield set_mask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_files_get_the_umask_mode(tmp_path, umask, mask, expected):
    umask(mask)
    write_text_atomic(tmp_path / "a.txt", "x")
    write_json_atomic(tmp_path / "run.json", {"status": "complete"})
    write_atomic(tmp_path / "model.pt", lambda p: torch.save({"w": torch.zeros(2)}, p))
    for name in ("a.txt", "run.json", "model.pt"):
        assert _mode(tmp_path / name) == expected, (name, oct(_mode(tmp_path / name)))


def test_overwriting_keeps_the_umask_mode(tmp_path, umask):
    umask(0o022)
    write_text_atomic(tmp_path / "a.txt", "x")
    write_text_atomic(tmp_path / "a.txt", "y")
    assert _mode(tmp_path / "a.txt") == 0o644 and (tmp_path / "a.txt").read_text() == "y"


def test_save_pretrained_files_get_the_umask_mode(tmp_path, umask):
    """transformers writes model.safetensors as 0600; exports go through atomic.save_pretrained."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from experiments.core.atomic import save_pretrained

    umask(0o022)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10, n_positions=8))
    save_pretrained(model, tmp_path / "out")
    files = list((tmp_path / "out").glob("*"))
    assert any(f.suffix == ".safetensors" for f in files)
    assert all(_mode(f) == 0o644 for f in files), {f.name: oct(_mode(f)) for f in files}


def test_exported_checkpoints_are_readable(tmp_path, umask):
    """A GPT-2 export (Karbevski) goes through atomic.save_pretrained: model.safetensors is 0644."""
    from experiments.karbevski.gpt.export import export
    from experiments.karbevski.gpt.model import GPT, GPTConfig

    umask(0o022)
    torch.manual_seed(0)
    folder = export(GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, d_model=8, mlp_hidden=16)),
                    tmp_path / "gpt2")
    weights = list(folder.glob("*.safetensors"))
    modes = {f.name: oct(_mode(f)) for f in folder.iterdir()}
    assert weights and set(modes.values()) == {"0o644"}, modes


def test_every_model_save_goes_through_the_umask_helper():
    """No experiment calls a model's save_pretrained directly (it would write 0600 safetensors)."""
    import re

    from tests.helpers.repo import REPO_ROOT

    offenders = []
    for path in (REPO_ROOT / "experiments").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            tokenizer = re.search(r"tok\w*(\(.*\))?\.save_pretrained\(", line)  # tokenizers write plain files
            if ".save_pretrained(" in line and not tokenizer and "atomic" not in path.name:
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{n}")
    assert not offenders, offenders
