"""Errors a user can fix. The CLI prints them as one line and exits non-zero, no traceback."""


class UserError(Exception):
    """Bad input: an unknown name, an ill-typed value, a model that can't be loaded, ..."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type when it has none), at most 200 characters: what
    a UserError quotes from a library's error, whose full text can run to pages (HTTP bodies, tracebacks
    of a failed conversion)."""
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:200]
