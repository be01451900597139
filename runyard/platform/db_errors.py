"""Which database errors are worth retrying (a summary of an error: ``runyard.domain.errors``)."""

from __future__ import annotations

import enum

import psycopg
from sqlalchemy import exc as sa

# Errors of the connection, the pool or the server's state: the same statement may pass on a
# retry. A statement timeout (QueryCanceled), a lock timeout, a serialization failure and a
# deadlock are psycopg OperationalErrors, so they are transient too.
_TRANSIENT: tuple[type[BaseException], ...] = (
    sa.OperationalError,
    sa.InterfaceError,
    sa.InternalError,
    sa.TimeoutError,
    sa.DisconnectionError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.InternalError,
    OSError,
)

# Errors of the statement or its values: the same statement fails the same way every time.
_DETERMINISTIC: tuple[type[BaseException], ...] = (
    sa.DataError,
    sa.IntegrityError,
    sa.ProgrammingError,
    sa.NotSupportedError,
    psycopg.DataError,
    psycopg.IntegrityError,
    psycopg.ProgrammingError,
    psycopg.NotSupportedError,
)


class Failure(enum.StrEnum):
    """How an error from a database write should be treated."""

    TRANSIENT = "transient"  # retry, within the caller's bounds
    DETERMINISTIC = "deterministic"  # never retry the same statement with the same values


def classify(exc: BaseException) -> Failure:
    """Transient for connection, pool and server-state errors; deterministic for everything
    else, including errors raised before the statement was sent (unencodable values)."""
    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return Failure.TRANSIENT
    if isinstance(exc, _DETERMINISTIC):
        return Failure.DETERMINISTIC
    if isinstance(exc, _TRANSIENT):
        return Failure.TRANSIENT
    if isinstance(exc, sa.DBAPIError) and isinstance(exc.orig, _TRANSIENT):
        return Failure.TRANSIENT
    return Failure.DETERMINISTIC
