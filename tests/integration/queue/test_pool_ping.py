"""The pool's ping: only a connection idle for a while is checked before use."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from runyard.platform.db import autocommit, make_engine, ping_when_idle

PID = text("SELECT pg_backend_pid() AS pid")


def _kill_pooled_connection(engine: Engine, database_url: str) -> int:
    pid = int(autocommit(engine, PID, {})[0].pid)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def test_ping_when_idle__an_idle_connection_broken_meanwhile_is_replaced_unseen(
    database_url: str,
):
    engine = make_engine(database_url, pool_size=1, max_overflow=0, pre_ping=False)
    ping_when_idle(engine, 0.0)  # every connection counts as idle
    try:
        dead = _kill_pooled_connection(engine, database_url)
        assert int(autocommit(engine, PID, {})[0].pid) != dead
    finally:
        engine.dispose()


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
