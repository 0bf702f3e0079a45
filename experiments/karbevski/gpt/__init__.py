"""A nanoGPT-style GPT with a W_Q = I option (Karbevski & Mijoski §5.1): the model, the five Table 2
variants, their parameter counts, training, checkpoints and export to stock transformers GPT-2."""
