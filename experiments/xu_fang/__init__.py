"""Xu & Fang, *Self-attention as a covariance readout*: the covariance math (streams, closed forms,
attention readouts, gradient-descent heads, collapse) and the four experiments built on it."""
