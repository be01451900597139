"""A watch over an engine's checked-out connections, to cut one whose peer went silent.

Timeouts in the connection settings (``runyard.platform.db.DbTimeouts``) help while the server
answers (a statement timeout) or while packets go unacknowledged (keepalives, ``tcp_user_timeout``).
A peer that accepts bytes and never replies (a hung proxy or pooler, a frozen server) leaves
a thread blocked in ``recv`` for good; shutting the socket down from another thread is what
wakes it, with an error the caller already handles as a lost connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event

logger = logging.getLogger(__name__)


@dataclass
class _Checkout:
    connection: Any
    thread_id: int
    since: float


class ConnectionWatch:
    """Knows which thread holds each checked-out connection of an engine, and since when."""

    def __init__(self, engine: Engine) -> None:
        self._lock = threading.Lock()
        self._out: dict[int, _Checkout] = {}
        event.listen(engine, "checkout", self._on_checkout)
        event.listen(engine, "checkin", self._on_checkin)

    def _on_checkout(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        with self._lock:
            self._out[id(record)] = _Checkout(
                dbapi_connection, threading.get_ident(), time.monotonic()
            )

    def _on_checkin(self, dbapi_connection: Any, record: Any) -> None:
        with self._lock:
            self._out.pop(id(record), None)

    def cut(self, *, thread_id: int | None = None, older_than: float | None = None) -> int:
        """Shut down the sockets of the connections held by ``thread_id``, or checked out for
        more than ``older_than`` seconds; their holders get a connection error. How many."""
        now = time.monotonic()
        cut = 0
        with self._lock:
            for key, held in list(self._out.items()):
                by_thread = thread_id is not None and held.thread_id == thread_id
                too_old = older_than is not None and now - held.since > older_than
                if not (by_thread or too_old):
                    continue
                # Under the lock: the holder cannot check it in and hand it on meanwhile.
                if _shut_down(held.connection):
                    cut += 1
                del self._out[key]
        return cut


def _shut_down(connection: Any) -> bool:
    """Shut the connection's socket down in both directions (the descriptor stays open)."""
    try:
        fd = int(connection.pgconn.socket)
    except Exception:
        return False  # already closed
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.close()
