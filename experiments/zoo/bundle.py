"""What a loaded model is: the module and what turns text (and images) into its inputs, kept together
because every user of a model also needs its tokenizer (prompts, stop tokens, saving a checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass
class ModelBundle:
    """A loaded model and what turns text (and images) into its inputs, whatever the architecture."""

    name: str
    model: nn.Module  # e.g. Gemma3ForCausalLM or Gemma3ForConditionalGeneration, eval mode
    tokenizer: object  # a transformers tokenizer
    processor: object | None = None  # Gemma3Processor for multimodal models
    is_random: bool = False  # built here (exported next to a patched copy as DIR/base)

    @property
    def multimodal(self) -> bool:
        return self.processor is not None
