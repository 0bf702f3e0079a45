"""Models below the papers: where weights come from (GGUF conversion, ...)."""
