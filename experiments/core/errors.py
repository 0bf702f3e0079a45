"""Errors a user can fix. The CLI prints them as one line and exits non-zero, no traceback."""


class UserError(Exception):
    """Bad input: an unknown name, an ill-typed value, a model that can't be loaded, ..."""


def first_line(err: BaseException, *, chain: bool = False, typed: bool = False, default: str | None = None) -> str:
    """The first line of an exception's message, at most 200 characters: what a UserError quotes from a
    library's error, whose full text can run to pages (HTTP bodies, tracebacks of a failed conversion).
    `chain`: the first exception of its chain of causes that says something (Hydra wraps OmegaConf's error);
    `typed`: `Type: line` (a run's log line); a message-less exception gives `default`, else its type."""
    said = err
    while chain and said is not None and not str(said).strip():
        said = said.__cause__ or said.__context__
    text = str(said).strip() if said is not None else ""
    if not text:
        return default or type(err).__name__
    line = text.splitlines()[0][:200]
    return f"{type(said).__name__}: {line}" if typed else line
