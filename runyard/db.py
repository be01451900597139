"""Engine construction, autocommit statements and the migration entry point.

Nothing is connected at import.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import psycopg
from sqlalchemy import Engine, TextClause, create_engine
from sqlalchemy.exc import DBAPIError

from runyard.settings import normalize_database_url
from runyard.tool_json import load_stored_json

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(
    database_url: str, *, pool_size: int = 5, max_overflow: int = 10, pre_ping: bool = True
) -> Engine:
    """A pooled psycopg 3 engine; with ``pre_ping`` connections are checked before use.

    Without it a connection broken by a database restart fails once, invalidates the pool and
    the caller's retry gets a fresh one (the worker retries every database error).
    """
    return create_engine(
        normalize_database_url(database_url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        # Every jsonb value read passes the read-side gate: a stored row is always servable.
        json_deserializer=load_stored_json,
    )


_COMPILED: dict[TextClause, str] = {}
_ROW_TYPES: dict[str, Callable[[Sequence[Any]], Any]] = {}
_CURSOR = "runyard.cursor"


def _rows(sql: str, cursor: psycopg.Cursor[Any]) -> list[Any]:
    """The result as named tuples, their type made once per statement."""
    make = _ROW_TYPES.get(sql)
    if make is None:
        if cursor.description is None:
            return []
        names = [column.name for column in cursor.description]
        row_type: Any = namedtuple("Row", names, rename=True)  # type: ignore[misc]
        make = _ROW_TYPES[sql] = row_type._make
    return [make(row) for row in cursor.fetchall()]


def autocommit(engine: Engine, statement: TextClause, params: Mapping[str, Any]) -> list[Any]:
    """Run one statement as its own transaction on a pooled connection; its rows.

    One round trip: no BEGIN/COMMIT, no SQLAlchemy execution layer. Errors are raised as
    SQLAlchemy's ``DBAPIError`` family (``OperationalError`` for a lost connection), and a
    broken connection invalidates the pool as SQLAlchemy itself would.
    """
    sql = _COMPILED.get(statement)
    if sql is None:
        sql = _COMPILED[statement] = str(statement.compile(dialect=engine.dialect))
    try:
        fairy = engine.raw_connection()
    except psycopg.Error as exc:
        raise DBAPIError.instance(sql, dict(params), exc, psycopg.Error) from exc
    conn = cast(psycopg.Connection[Any], fairy.driver_connection)
    try:
        conn.autocommit = True
        try:
            # One cursor per connection, kept in the pool record's info (dropped with it).
            cursor = fairy.info.get(_CURSOR)
            if cursor is None or cursor.closed or cursor.connection is not conn:
                cursor = fairy.info[_CURSOR] = conn.cursor()
            cursor.execute(sql, params)
            rows = _rows(sql, cursor)
        finally:
            if not (conn.closed or conn.broken):
                conn.autocommit = False
    except psycopg.Error as exc:
        lost = conn.closed or conn.broken
        if lost:
            engine.pool._invalidate(fairy, exc)
        elif conn.autocommit:
            fairy.invalidate(exc)  # never hand an autocommit connection to a transaction
        raise DBAPIError.instance(
            sql, dict(params), exc, psycopg.Error, connection_invalidated=lost
        ) from exc
    finally:
        fairy.close()
    return rows


def alembic_config(database_url: str) -> object:
    """An Alembic ``Config`` pointing at the packaged migrations and the given database."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalize_database_url(database_url))
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (``alembic upgrade head``)."""
    from alembic import command
    from alembic.config import Config

    config = alembic_config(database_url)
    assert isinstance(config, Config)
    command.upgrade(config, revision)
