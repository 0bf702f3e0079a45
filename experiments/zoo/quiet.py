"""transformers' own logging silenced while a model is loaded, converted or saved: the user of this CLI
gets one line on failure and nothing on success, not the library's warnings and progress bars."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def quiet_transformers():
    """transformers' and the hub's warnings and progress bars off while loading: the user gets one line, or
    nothing."""
    from transformers.utils import logging as hf_logging

    before, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights", "Writing model shards": not ours to show
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)
        if bars:
            hf_logging.enable_progress_bar()
