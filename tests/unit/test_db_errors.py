"""Which database errors the worker retries, and the summary it stores of one."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from sqlalchemy import exc as sa

from runyard.domain.errors import describe
from runyard.platform.db_errors import Failure, classify


def _wrapped(
    cls: type[sa.DBAPIError], orig: Exception, *, connection_invalidated: bool = False
) -> sa.DBAPIError:
    return cls(
        "SELECT :v", {"v": "secret value"}, orig, connection_invalidated=connection_invalidated
    )


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_wrapped(sa.OperationalError, psycopg.OperationalError("gone")), Failure.TRANSIENT),
        (_wrapped(sa.InterfaceError, psycopg.InterfaceError("closed")), Failure.TRANSIENT),
        (_wrapped(sa.InternalError, psycopg.InternalError("xx")), Failure.TRANSIENT),
        (sa.TimeoutError("QueuePool limit reached"), Failure.TRANSIENT),
        (sa.DisconnectionError("gone"), Failure.TRANSIENT),
        (psycopg.OperationalError("server closed the connection"), Failure.TRANSIENT),
        (psycopg.errors.QueryCanceled("statement timeout"), Failure.TRANSIENT),
        (psycopg.errors.LockNotAvailable("lock timeout"), Failure.TRANSIENT),
        (psycopg.errors.SerializationFailure("retry"), Failure.TRANSIENT),
        (psycopg.errors.DeadlockDetected("retry"), Failure.TRANSIENT),
        (psycopg.errors.AdminShutdown("restart"), Failure.TRANSIENT),
        (ConnectionResetError("reset"), Failure.TRANSIENT),
        (TimeoutError("socket"), Failure.TRANSIENT),
        (_wrapped(sa.DataError, psycopg.DataError("NUL")), Failure.DETERMINISTIC),
        (_wrapped(sa.IntegrityError, psycopg.IntegrityError("dup")), Failure.DETERMINISTIC),
        (_wrapped(sa.ProgrammingError, psycopg.ProgrammingError("syntax")), Failure.DETERMINISTIC),
        (_wrapped(sa.NotSupportedError, psycopg.NotSupportedError("no")), Failure.DETERMINISTIC),
        (psycopg.errors.InvalidTextRepresentation("NaN"), Failure.DETERMINISTIC),
        (psycopg.errors.UntranslatableCharacter("\\u0000"), Failure.DETERMINISTIC),
        (psycopg.errors.NumericValueOutOfRange("1e400"), Failure.DETERMINISTIC),
        (psycopg.errors.UniqueViolation("dup"), Failure.DETERMINISTIC),
        (psycopg.errors.UndefinedColumn("no such column"), Failure.DETERMINISTIC),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates"), Failure.DETERMINISTIC),
        (ValueError("Out of range float values are not JSON compliant"), Failure.DETERMINISTIC),
        (TypeError("not JSON serializable"), Failure.DETERMINISTIC),
        (RecursionError("maximum recursion depth"), Failure.DETERMINISTIC),
        (KeyError("State"), Failure.DETERMINISTIC),
        # A deterministic class with a dead connection: the connection is what failed.
        (
            _wrapped(sa.DataError, psycopg.DataError("x"), connection_invalidated=True),
            Failure.TRANSIENT,
        ),
        # A generic DBAPIError is judged by the driver's error it wraps.
        (_wrapped(sa.DatabaseError, psycopg.OperationalError("gone")), Failure.TRANSIENT),
        (_wrapped(sa.DatabaseError, psycopg.DatabaseError("?")), Failure.DETERMINISTIC),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_classify__table(error: BaseException, expected: Failure):
    assert classify(error) is expected


def test_describe__names_the_drivers_error_not_the_parameters():
    error = _wrapped(sa.DataError, psycopg.DataError("invalid input syntax\nCONTEXT: secret"))
    text = describe(error)
    assert text == "DataError: invalid input syntax"
    assert "secret" not in text


def test_describe__caps_and_cleans():
    text = describe(ValueError("a\x00b" + "\ud800" + "x" * 1000), cap=50)
    assert len(text) == 50 and text.endswith("...")
    assert "\x00" not in text
    text.encode("utf-8")  # no unpaired surrogate left


def test_describe__an_exception_without_message():
    assert describe(KeyError()) == "KeyError"
