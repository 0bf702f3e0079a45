"""Errors a user can fix. The CLI prints them as one line and exits non-zero, no traceback."""


class UserError(Exception):
    """Bad input: an unknown name, an ill-typed value, a model that can't be loaded, ..."""
