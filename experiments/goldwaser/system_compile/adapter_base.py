"""Which base model the adapter names (adapter_config.json's `base_model_name_or_path`), so that a user's
`AutoPeftModelForCausalLM.from_pretrained(DIR)` finds it, offline wherever the base was local:

- a hub id: the id (peft hands it to `from_pretrained`, which reads the hub or its local cache);
- a local checkpoint folder: its absolute path (a relative one would be read against the user's working
  directory, not the adapter's folder);
- a model that no stock loader finds by the name the run was given: an offline random model (tiny-llama: its
  weights exist only in the process that drew them) or a GGUF (`model=qwen2.5-0.5b`, `model=PATH.gguf`,
  dequantized by zoo/gguf.py). Its base weights, the very ones the adapter's ΔW was taken from, are saved
  as a stock checkpoint (with the tokenizer) in `base/` beside the adapter, and the adapter names that
  folder's absolute path.

Why `base/` for a GGUF and not the cache folder zoo/gguf.py converted it into, which is a stock checkpoint
too: that folder is a cache (its name keys the GGUF's path, size and mtime and the cache's format version; a
cleared cache or a new format does not bring it back under the same name, another machine never has it)
and it is float32 where the run may have used bfloat16; `base/` is exactly what the ΔW is relative to, in
the run's dtype, and travels with the run folder. Nor the model's hub release: the GGUF's weights are
dequantized Q4_K_M values, not the release's, and the adapter on the release's weights would not give the
merged checkpoint. The price is a checkpoint's size beside a megabyte adapter, as format=merged costs."""

from __future__ import annotations

from pathlib import Path

BASE_FOLDER = "base"


def written_base(model: str) -> str | None:
    """Why the base of `model` is written beside the adapter (module docstring), or None when a stock loader
    finds it by its name."""
    from experiments.patching.load import RANDOM_OFFLINE_MODELS
    from experiments.zoo import gguf

    if model in RANDOM_OFFLINE_MODELS:
        return f"model={model} is a random model drawn offline: its weights exist nowhere else"
    if gguf.is_gguf_model(model):
        return (f"model={model} is a GGUF, dequantized by icl-exp into a cache folder that is no stable place to "
                "name (the weights are the dequantized ones, not the hub release's)")
    return None


def base_name(model: str, folder: Path) -> str:
    """What adapter_config.json names as the base: the hub id, a local folder's absolute path, or the absolute
    path of `folder`/base/ where the base is written there (`written_base`)."""
    if written_base(model) is not None:
        return str((Path(folder) / BASE_FOLDER).resolve())
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def save_base(model, tokenizer, folder: Path) -> Path:
    """The model, which must hold the base weights (adapter_reload.base_weights), and its tokenizer as a stock
    checkpoint in `folder`/base/."""
    from experiments.core.atomic import save_pretrained
    from experiments.zoo.quiet import quiet_transformers

    where = Path(folder) / BASE_FOLDER
    with quiet_transformers():  # no "Writing model shards" bar
        save_pretrained(model, where)
        save_pretrained(tokenizer, where)
    return where
