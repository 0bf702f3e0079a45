"""The toy nn.Modules of Dherin et al. (explicit arguments; no config readers, no training)."""
