"""docs/python.md runs: its python blocks, in order, as one script in a fresh interpreter (a notebook's
session), on the offline random tiny-llama, so the page cannot drift from the code. The page's own asserts
are the checks (the patch agrees where the control does not; the stock reload reproduces the context; the
closed loop's last-layer control is far from the record); this test adds that what it says it writes is
there."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "python.md"
pytestmark = pytest.mark.numeric


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_the_blocks_are_found():
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 6 and all(b.strip() for b in blocks)
    page = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n"
    assert python_blocks(page) == ["a = 1\n", "b = 2\n"]  # bash blocks are not run


def test_the_python_page_runs_as_written(tmp_path):
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(python_blocks(PAGE.read_text())))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llama LlamaForCausalLM random" in proc.stdout
    assert (tmp_path / "snow" / "patched" / "config.json").is_file() and (tmp_path / "snow" / "inputs.json").is_file()
    assert (tmp_path / "runs" / "cov_rate" / "claims.csv").is_file()
