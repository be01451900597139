"""Engine construction, autocommit statements and the migration entry point.

Nothing is connected at import.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
from sqlalchemy import Engine, TextClause, create_engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from runyard.domain.tool_json import load_stored_json
from runyard.platform.idle_ping import ping_when_idle
from runyard.platform.pooling import ConnectionPlan, connection_plan
from runyard.platform.settings import Settings, normalize_database_url

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


@dataclass(frozen=True)
class DbTimeouts:
    """How long a connection may take to open, go silent, run a statement or wait for one.

    ``statement_seconds``/``lock_seconds`` of None leave the server's own (usually none).
    """

    connect_seconds: int = 5
    keepalives_idle_seconds: int = 10
    keepalives_interval_seconds: int = 5
    keepalives_count: int = 3
    statement_seconds: float | None = None
    lock_seconds: float | None = None
    pool_seconds: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings, *, statements: bool = True) -> DbTimeouts:
        """The ``RUNYARD_DB_*`` settings; without ``statements`` no statement or lock timeout."""
        return cls(
            connect_seconds=settings.db_connect_timeout_seconds,
            keepalives_idle_seconds=settings.db_keepalives_idle_seconds,
            keepalives_interval_seconds=settings.db_keepalives_interval_seconds,
            keepalives_count=settings.db_keepalives_count,
            statement_seconds=settings.db_statement_timeout_seconds if statements else None,
            lock_seconds=settings.db_lock_timeout_seconds if statements else None,
            pool_seconds=settings.db_pool_timeout_seconds,
        )


def libpq_params(
    timeouts: DbTimeouts,
    url_options: str | None = None,
    *,
    session_timeouts: bool = True,
    generic_plans: bool = False,
) -> dict[str, Any]:
    """The libpq connection parameters that carry ``timeouts``.

    ``tcp_user_timeout`` matches the keepalive budget, so a request sent into a dead link
    fails as soon as an idle one would (instead of after the kernel's ~15 minutes of
    retransmissions). Session timeouts travel in ``options``, after any the URL sets, unless
    ``session_timeouts`` is off (a transaction pooler refuses that startup parameter, and a
    session setting would not follow the client from one server connection to the next).
    ``generic_plans`` asks for ``plan_cache_mode=force_generic_plan`` the same way, unless the
    URL's options choose a mode themselves (docs/decisions/0037-generic-plans-for-the-worker.md).
    """
    silent = timeouts.keepalives_idle_seconds + (
        timeouts.keepalives_interval_seconds * timeouts.keepalives_count
    )
    params: dict[str, Any] = {
        "connect_timeout": timeouts.connect_seconds,
        "keepalives": 1,
        "keepalives_idle": timeouts.keepalives_idle_seconds,
        "keepalives_interval": timeouts.keepalives_interval_seconds,
        "keepalives_count": timeouts.keepalives_count,
        "tcp_user_timeout": silent * 1000,
    }
    options = [url_options] if url_options else []
    for name, seconds in (
        ("statement_timeout", timeouts.statement_seconds if session_timeouts else None),
        ("lock_timeout", timeouts.lock_seconds if session_timeouts else None),
    ):
        if seconds is not None:
            options.append(f"-c {name}={max(1, round(seconds * 1000))}")
    # Postgres takes the setting's name in either case, with dashes for underscores.
    chosen = "plan_cache_mode" in (url_options or "").lower().replace("-", "_")
    if generic_plans and session_timeouts and not chosen:
        options.append("-c plan_cache_mode=force_generic_plan")
    if options:
        params["options"] = " ".join(options)
    return params


def make_engine(
    database_url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    pre_ping: bool = True,
    timeouts: DbTimeouts | None = None,
    plan: ConnectionPlan | None = None,
    generic_plans: bool = False,
) -> Engine:
    """A pooled psycopg 3 engine; with ``pre_ping`` a connection idle for more than
    ``PRE_PING_IDLE_SECONDS`` is checked before use (one used just now is not: on a hot pool
    the ping would be a round trip per statement).

    A connection broken by a database restart that is not checked fails once, invalidates
    the pool and the caller's retry gets a fresh one (the worker retries every database
    error). Every connection gets ``timeouts`` (by default a connect timeout and keepalives
    only), and follows ``plan`` (by default a direct connection to Postgres). With
    ``generic_plans`` its prepared statements keep their generic plans (``libpq_params``).
    """
    url = normalize_database_url(database_url)
    timeouts = timeouts or DbTimeouts()
    plan = plan or connection_plan("none", database_url, "")
    url_options = make_url(url).query.get("options")
    connect_args = libpq_params(
        timeouts,
        url_options if isinstance(url_options, str) else None,
        session_timeouts=plan.session_timeouts,
        generic_plans=generic_plans,
    )
    connect_args["prepare_threshold"] = plan.prepare_threshold
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_recycle=1800,
        pool_timeout=timeouts.pool_seconds,
        connect_args=connect_args,
        # Every jsonb value read passes the read-side gate: a stored row is always servable.
        json_deserializer=load_stored_json,
    )
    if pre_ping:
        ping_when_idle(engine, PRE_PING_IDLE_SECONDS)
    return engine


# A pooled connection given back less than this long ago is used without a ping.
PRE_PING_IDLE_SECONDS = 1.0


# Each statement compiled once to PostgreSQL's own ``$n`` placeholders with the names of
# its parameters in order: sent through a raw cursor, psycopg never parses the text again
# (it caches its own parse only for statements under 4 KiB, and the queue's are longer).
_COMPILED: dict[TextClause, tuple[str, tuple[str, ...]]] = {}
_ROW_TYPES: dict[str, Callable[[Sequence[Any]], Any]] = {}
_CURSOR = "runyard.cursor"
_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s")


def positional(pyformat_sql: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders as ``$n`` (one number per name) and ``%%`` as ``%``; the
    names in number order."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, pyformat_sql), tuple(names)


def _compiled(engine: Engine, statement: TextClause) -> tuple[str, tuple[str, ...]]:
    found = _COMPILED.get(statement)
    if found is None:
        found = _COMPILED[statement] = positional(str(statement.compile(dialect=engine.dialect)))
    return found


def _rows(sql: str, cursor: psycopg.RawCursor[Any]) -> list[Any]:
    """The result as named tuples, their type made once per statement."""
    make = _ROW_TYPES.get(sql)
    if make is None:
        if cursor.description is None:
            return []
        names = [column.name for column in cursor.description]
        row_type: Any = namedtuple("Row", names, rename=True)  # type: ignore[misc]
        make = _ROW_TYPES[sql] = row_type._make
    return [make(row) for row in cursor.fetchall()]


def _values(names: tuple[str, ...], params: Mapping[str, Any]) -> tuple[Any, ...]:
    try:
        return tuple([params[name] for name in names])
    except KeyError as missing:
        raise psycopg.ProgrammingError(f"query parameter missing: {missing.args[0]}") from None


def autocommit(engine: Engine, statement: TextClause, params: Mapping[str, Any]) -> list[Any]:
    """Run one statement as its own transaction on a pooled connection; its rows.

    One round trip: no BEGIN/COMMIT, no SQLAlchemy execution layer. Errors are raised as
    SQLAlchemy's ``DBAPIError`` family (``OperationalError`` for a lost connection, and for a
    pool that had no connection to give within its timeout, so callers that retry database
    errors retry that too), and a broken connection invalidates the pool as SQLAlchemy
    itself would.
    """
    sql, names = _compiled(engine, statement)
    try:
        values = _values(names, params)
        fairy = engine.raw_connection()
    except psycopg.Error as exc:
        raise DBAPIError.instance(sql, dict(params), exc, psycopg.Error) from exc
    except PoolTimeoutError as exc:
        raise OperationalError(sql, dict(params), exc) from exc
    conn = cast(psycopg.Connection[Any], fairy.driver_connection)
    try:
        conn.autocommit = True
        try:
            # One raw cursor per connection, kept in the pool record's info (dropped with it).
            cursor = fairy.info.get(_CURSOR)
            if cursor is None or cursor.closed or cursor.connection is not conn:
                cursor = fairy.info[_CURSOR] = psycopg.RawCursor(conn)
            cursor.execute(sql, values)
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
