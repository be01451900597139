"""Checking a pooled connection before use only after it sat idle: a hot pool pays no ping.

A pool's pre-ping costs a round trip on every checkout. Most checkouts of a busy API take a
connection given back milliseconds ago, which a ping tells nothing new about; one left in the
pool for longer may have been cut (a database restart, a pooler or firewall dropping idle
links), and is checked first. A connection cut while hot fails its statement once, and the
error invalidates the pool (``runyard.platform.db.autocommit`` and SQLAlchemy alike), so the
next checkout connects afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError

_GIVEN_BACK = "runyard.given_back_at"


def ping_when_idle(
    engine: Engine, idle_seconds: float, *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Ping a connection at checkout if it was given back more than ``idle_seconds`` ago; one
    that fails is replaced (the pool connects again). Meant for an engine made without
    ``pre_ping``. A new connection is not pinged: it has just answered."""

    def given_back(dbapi_connection: Any, record: Any) -> None:
        record.info[_GIVEN_BACK] = clock()

    def taken(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(_GIVEN_BACK)
        if since is None or clock() - since <= idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool drops this connection and checks out another (a fresh one, if need be).
            raise DisconnectionError(f"an idle connection failed its ping: {exc}") from exc

    event.listen(engine.pool, "checkin", given_back)
    event.listen(engine.pool, "checkout", taken)
