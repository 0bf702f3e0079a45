"""Run machinery shared by every experiment: registry, run directory, progress, plotting."""
