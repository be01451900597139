"""A summary of an error that is safe to store or show."""

from __future__ import annotations


def describe(exc: BaseException, cap: int = 300) -> str:
    """``Class: first line of the message``, capped, without NULs or unencodable characters.

    A SQLAlchemy error is described by the driver's error it wraps: its own text carries the
    statement's parameters, which may hold the very values that could not be stored.
    """
    # Read by shape, not by class, so the domain needs neither SQLAlchemy nor the driver:
    # SQLAlchemy's StatementError keeps the driver's error in ``orig``, psycopg's errors carry
    # the server's message in ``diag``.
    orig = getattr(exc, "orig", None)
    cause: BaseException = orig if isinstance(orig, BaseException) else exc
    diag = getattr(cause, "diag", None)
    if diag is not None and getattr(diag, "message_primary", None):
        # The server's CONTEXT may quote the value itself; the detail says what was wrong.
        message = " ".join(filter(None, (diag.message_primary, diag.message_detail)))
    else:
        lines = str(cause).strip().splitlines()
        message = lines[0].strip() if lines else ""
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    text = text.replace("\x00", "").encode("utf-8", errors="replace").decode("utf-8")
    return text if len(text) <= cap else text[: cap - 3] + "..."
