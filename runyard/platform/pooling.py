"""Which connection does what, directly on Postgres or behind a transaction pooler.

Behind PgBouncer in transaction mode a client connection meets a different server session
for every transaction, so nothing session-scoped may be relied on: server-side prepared
statements, settings sent at connect (``options``), LISTEN. The rule below says what each
engine and the LISTEN connection may use; the services log it once at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

Pooler = Literal["none", "transaction"]

# psycopg's own default: a statement run this many times on a connection is prepared.
PSYCOPG_PREPARE_THRESHOLD = 5


@dataclass(frozen=True)
class ConnectionPlan:
    """What a process's connections may rely on."""

    # psycopg's ``prepare_threshold``; None never prepares server-side.
    prepare_threshold: int | None
    # Statement and lock timeouts sent as startup ``options`` (else the role's defaults apply).
    session_timeouts: bool
    # Where LISTEN connects; None: no LISTEN, the loops poll.
    listen_url: str | None


def connection_plan(
    pooler: Pooler,
    database_url: str,
    listen_database_url: str,
    *,
    pooler_prepares: bool = False,
) -> ConnectionPlan:
    """The plan for ``pooler``: LISTEN goes to ``listen_database_url`` when set, else to the
    database URL unless a transaction pooler stands in between (then nowhere: polling).

    ``pooler_prepares``: the transaction pooler carries protocol-level prepared statements
    (PgBouncer 1.21 and later with ``max_prepared_statements`` above 0), so psycopg prepares
    behind it too; without it a statement is planned afresh each time it runs.
    """
    if pooler == "transaction":
        prepare = PSYCOPG_PREPARE_THRESHOLD if pooler_prepares else None
        return ConnectionPlan(prepare, False, listen_database_url or None)
    return ConnectionPlan(PSYCOPG_PREPARE_THRESHOLD, True, listen_database_url or database_url)


def log_plan(logger: logging.Logger, plan: ConnectionPlan, poll_seconds: float | None) -> None:
    """Say once at start how this process reaches the database, if anything is unusual;
    ``poll_seconds`` is how often it re-reads without LISTEN (None: it never listens)."""
    if plan.session_timeouts and plan.listen_url is not None:
        return
    prepared = (
        "prepared statements through the pooler"
        if plan.prepare_threshold is not None
        else "no prepared statements"
    )
    if poll_seconds is None:
        listen = ""
    elif plan.listen_url is not None:
        listen = "; LISTEN on the direct URL"
    else:
        listen = f"; no LISTEN (no RUNYARD_LISTEN_DATABASE_URL): polling every {poll_seconds:g} s"
    logger.info(
        "database behind a transaction pooler: %s, statement and lock timeouts from the"
        " database role%s",
        prepared,
        listen,
        extra={"listen": plan.listen_url is not None, "poll_seconds": poll_seconds},
    )
