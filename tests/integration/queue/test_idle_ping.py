"""A pool that pings a connection only after it sat idle: none on a hot pool, and an idle
connection the server cut is replaced before the statement, which then succeeds."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from runyard.platform.db import autocommit, make_engine
from runyard.platform.idle_ping import ping_when_idle

PID = text("SELECT pg_backend_pid() AS pid")


def _kill_pooled_connection(engine: Engine, database_url: str) -> int:
    pid = int(autocommit(engine, PID, {})[0].pid)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def test_ping_when_idle__hot_connections_are_not_pinged_idle_ones_are_and_a_cut_one_is_replaced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
):
    now = [100.0]
    eng = make_engine(database_url, pool_size=1, max_overflow=0, pre_ping=False)
    ping_when_idle(eng, 5.0, clock=lambda: now[0])
    pings: list[Any] = []
    real_ping = eng.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        return real_ping(dbapi_connection)

    monkeypatch.setattr(eng.dialect, "do_ping", counted)
    try:
        first = autocommit(eng, PID, {})[0].pid  # a new connection: not pinged
        now[0] += 4.0
        assert autocommit(eng, PID, {})[0].pid == first
        assert pings == []

        now[0] += 6.0  # idle past the limit: pinged, and still good
        assert autocommit(eng, PID, {})[0].pid == first
        assert len(pings) == 1

        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        now[0] += 6.0  # the cut connection fails its ping: the statement gets a new one
        second = autocommit(eng, PID, {})[0].pid
        assert second != first
        assert len(pings) == 2
    finally:
        eng.dispose()


def test_ping_when_idle__a_connection_used_just_now_is_not_pinged(database_url: str):
    engine = make_engine(database_url, pool_size=1, max_overflow=0, pre_ping=False)
    ping_when_idle(engine, 3600.0)  # every connection counts as hot
    try:
        _kill_pooled_connection(engine, database_url)
        # No ping: the statement meets the broken connection, which the pool then replaces.
        with pytest.raises(OperationalError):
            autocommit(engine, PID, {})
        assert autocommit(engine, PID, {})[0].pid > 0
    finally:
        engine.dispose()
