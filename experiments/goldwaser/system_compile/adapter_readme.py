"""The README.md the run writes beside the adapter's files (format=peft): what the adapter is, how to load
it, and which base model it is relative to: where the run wrote that base itself (adapter_base.py), why,
and what to change when the folder moves."""

from __future__ import annotations

from experiments.goldwaser.system_compile.adapter_base import BASE_FOLDER


def readme(model: str, method: str, rank: int, dtype: str, system: str, base: str,
           written: str | None, use: list[str]) -> str:
    """The README's text: `base` is what adapter_config.json names, `written` why base/ holds it (or None),
    `use` the lines of Python that load and run the adapter."""
    code = "\n".join(use)
    lines = [
        "# A system prompt as a PEFT LoRA adapter",
        "",
        f"Written by icl-exp (system_compile, method={method}, rank {rank}, {dtype}) from model={model}: the system "
        "prompt below compiled into a low-rank change of the model's weights, so that the model answers as if "
        "it read the prompt without the prompt in its input. compiled.json beside it has what the run measured "
        "on held-out queries (the adapter loaded back with peft onto the base weights).",
        "",
        *(f"> {line}" for line in system.splitlines()),
        "",
        "## Load it",
        "",
        "```python",
        code,
        "```",
        "",
        "`m.merge_and_unload()` turns it into a plain transformers model with the change merged in.",
        "",
        "## The base model",
        "",
        f"adapter_config.json names it (`base_model_name_or_path`): `{base}`.",
    ]
    if written is None:
        lines.append("AutoPeftModelForCausalLM loads it from there: a hub id from the hub (or its local cache), "
                     "a folder from its absolute path.")
    else:
        lines += [
            "",
            f"{written}; so the run saved the base weights the adapter is relative to, in the run's dtype, as a "
            f"stock transformers checkpoint (with the tokenizer) in `{BASE_FOLDER}/` here, and the adapter names "
            f"that folder's absolute path. If you move this folder, set `base_model_name_or_path` in "
            f"adapter_config.json to `{BASE_FOLDER}/`'s new absolute path (or load the base yourself: "
            f"`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), DIR)`).",
        ]
    return "\n".join(lines) + "\n"
