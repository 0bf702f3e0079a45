"""Small stand-ins for the registry's GGUF chunk packages: a tiny GGUF written with the `gguf` package, split
into installed distributions (a dist-info folder with METADATA and RECORD, the data file) on a folder put on
sys.path, so importlib.metadata finds them exactly as it finds the real ones. Each bad-input test damages
one thing and points a BundledModel row at them."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from pathlib import Path

from experiments.zoo.bundled_gguf import QWEN_05B, BundledModel

VERSION = "0.9.0"


def tiny_gguf(path: Path, architecture: str = "qwen2") -> bytes:
    """A valid GGUF of `architecture` with a name, a chat template, the hyperparameters transformers reads
    into a config (one layer, d = 8) and one small tensor; its bytes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test model")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", np.arange(64 * 8, dtype=np.float32).reshape(64, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def install_chunks(site: Path, data: bytes, parts: int = 3, version: str = VERSION) -> BundledModel:
    """`data` split into `parts` installed distributions fake-gguf-part1.. under `site` (put it on sys.path),
    and the Qwen row of the table pointed at them, with `data`'s size and sha256."""
    cut = [len(data) * i // parts for i in range(parts + 1)]
    chunks = []
    for i in range(1, parts + 1):
        package, rel = f"fake_gguf_part{i}", f"fake_gguf_part{i}/data/part{i:02d}.bin"
        blob = data[cut[i - 1]:cut[i]]
        (site / package / "data").mkdir(parents=True)
        (site / rel).write_bytes(blob)
        info = site / f"{package}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-gguf-part{i}\nVersion: {version}\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"{rel},sha256={digest},{len(blob)}\n{info.name}/METADATA,,\n")
        chunks.append((f"fake-gguf-part{i}", rel))
    return replace(QWEN_05B, name="fake-model", gguf_name="fake.gguf", chunks=tuple(chunks), version=VERSION,
                   size=len(data), sha256=hashlib.sha256(data).hexdigest())
