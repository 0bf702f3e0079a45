"""Dherin et al., *Learning without training*: the rank-1 patch ΔW on small trained transformers for
in-context linear regression (Figs 2–6, App. E), the toy models only they train, their training and
the implicit gradient-descent dynamics."""
