"""Samplers and corpora."""
