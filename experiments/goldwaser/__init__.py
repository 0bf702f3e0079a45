"""Goldwaser et al., *Equivalence of context and parameter updates in modern transformer blocks*:
per-token patches over all layers of a pretrained decoder (Figs 3–5, Table 1). The patch math and the
architecture adapters live in `experiments/patching/`, shared with Dherin et al."""
