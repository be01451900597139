"""Which database errors mean "the database cannot serve now" (503) and which are bugs (500)."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from sqlalchemy import exc as sa_exc

from api.problems import database_unavailable


def wrapped(orig: Exception, *, connection_invalidated: bool = False) -> sa_exc.DBAPIError:
    """As SQLAlchemy raises a driver error."""
    error = sa_exc.DBAPIError.instance(
        "SELECT 1", {}, orig, psycopg.Error, connection_invalidated=connection_invalidated
    )
    assert isinstance(error, sa_exc.DBAPIError)
    return error


@pytest.mark.parametrize(
    ("error", "unavailable"),
    [
        (wrapped(psycopg.OperationalError("connection refused")), True),
        (wrapped(psycopg.InterfaceError("the connection is closed")), True),
        (wrapped(psycopg.errors.QueryCanceled("statement timeout")), True),
        (wrapped(psycopg.errors.LockNotAvailable("lock timeout")), True),
        (wrapped(psycopg.errors.AdminShutdown("terminating connection")), True),
        (wrapped(psycopg.errors.TooManyConnections("too many clients")), True),
        (wrapped(psycopg.errors.DeadlockDetected("deadlock")), True),
        (wrapped(psycopg.errors.ReadOnlySqlTransaction("standby")), True),
        (wrapped(psycopg.InternalError("in failed transaction")), True),
        (wrapped(psycopg.DatabaseError("unknown")), True),
        (sa_exc.TimeoutError("QueuePool limit reached"), True),
        (sa_exc.DisconnectionError("gone"), True),
        (psycopg.OperationalError("raw"), True),
        (psycopg.InterfaceError("raw"), True),
        (wrapped(psycopg.errors.UniqueViolation("duplicate")), False),
        (wrapped(psycopg.errors.UndefinedTable("no table")), False),
        (wrapped(psycopg.errors.InvalidTextRepresentation("bad uuid")), False),
        (wrapped(psycopg.NotSupportedError("no")), False),
        (wrapped(psycopg.errors.UndefinedTable("no table"), connection_invalidated=True), True),
        (psycopg.errors.UniqueViolation("raw duplicate"), False),
        (ValueError("not the database"), False),
        (sa_exc.NoResultFound("no row"), False),
    ],
)
def test_database_unavailable__transient_errors_yes_bugs_no(error: Exception, unavailable: bool):
    assert database_unavailable(error) is unavailable
