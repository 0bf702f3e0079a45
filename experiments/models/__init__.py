"""Models trained here: the linear-regression contextual block (attention or RNN), the deep post-LN stack."""
