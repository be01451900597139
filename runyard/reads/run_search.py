"""The dashboard's run search: the runs list's filters plus a batch, a requested-between
window, and an id, id prefix or text to find, all in one bounded, indexed read.

Tenant-scoped exactly as ``RunReader.page``: a tenant's rows come from
``ix_tool_runs_tenant_requested`` (a ``requested_at`` range included), a batch's from
``ix_tool_runs_batch``, an id prefix is a primary-key range. Text is never looked for in the
whole table: only among the newest ``TEXT_SEARCH_WINDOW`` runs the other filters select (after
the page's cursor), so a search reads at most that many rows; the page then offers to look
further back from where the window ended.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Cast, Engine, Select, Text, or_, select, tuple_
from sqlalchemy.orm import Session, aliased

from runyard.domain.run_search import SearchTerm
from runyard.domain.states import RunStatus
from runyard.platform.models import ToolRun
from runyard.reads.cursors import decode_cursor_parts, encode_cursor_parts
from runyard.reads.runs import encode_cursor

# The most rows a text search reads per page.
TEXT_SEARCH_WINDOW = 2000


@dataclass(frozen=True)
class RunSearch:
    """What the runs page asks for; ``tenant=None`` means every tenant (admins only)."""

    tenant: str | None
    status: RunStatus | None = None
    tool: str | None = None
    batch_id: uuid.UUID | None = None
    requested_from: datetime | None = None  # inclusive
    requested_before: datetime | None = None  # exclusive
    term: SearchTerm | None = None


@dataclass(frozen=True)
class SearchPage:
    """One page of matches; ``searched_to`` is set when a text search stopped at its window
    (the time of the oldest run it read), so the page can say how far back it looked."""

    runs: list[ToolRun]
    next_cursor: str | None
    searched_to: datetime | None = None


def filtered(search: RunSearch, cursor: str | None = None) -> Select[ToolRun]:
    """The runs the filters select, newest first (the caller adds the LIMIT)."""
    query = select(ToolRun)
    if search.tenant is not None:
        query = query.where(ToolRun.tenant == search.tenant)
    if search.status is not None:
        query = query.where(ToolRun.status == search.status)
    if search.tool is not None:
        query = query.where(ToolRun.tool == search.tool)
    if search.batch_id is not None:
        query = query.where(ToolRun.batch_id == search.batch_id)
    if search.requested_from is not None:
        query = query.where(ToolRun.requested_at >= search.requested_from)
    if search.requested_before is not None:
        query = query.where(ToolRun.requested_at < search.requested_before)
    term = search.term
    if term is not None and term.ids is not None:
        query = query.where(ToolRun.id.between(term.ids.low, term.ids.high))
    if cursor is not None:
        stamp, last_id = decode_cursor_parts(cursor)
        query = query.where(tuple_(ToolRun.requested_at, ToolRun.id) < tuple_(stamp, last_id))
    return query.order_by(ToolRun.requested_at.desc(), ToolRun.id.desc())


def window_marks(query: Select[ToolRun], term: SearchTerm) -> Select[datetime, uuid.UUID, bool]:
    """One pass over the newest ``TEXT_SEARCH_WINDOW`` runs of ``query``: each one's place
    and whether its input or error holds the text (no row bodies leave the database)."""
    window = query.limit(TEXT_SEARCH_WINDOW).subquery()
    scanned = aliased(ToolRun, window)
    found = []
    if term.in_input:
        found.append(Cast(scanned.input, Text).icontains(term.text, autoescape=True))
    if term.in_error:
        found.append(scanned.error.icontains(term.text, autoescape=True))
    return select(scanned.requested_at, scanned.id, or_(*found).label("hit")).order_by(
        scanned.requested_at.desc(), scanned.id.desc()
    )


def search_runs(
    engine: Engine, search: RunSearch, *, limit: int, cursor: str | None = None
) -> SearchPage:
    """Newest first, keyset-paginated on ``(requested_at, id)``; raises ``BadCursor``."""
    query = filtered(search, cursor)
    term = search.term
    with Session(engine, expire_on_commit=False) as session:
        if term is None or term.text is None:
            rows = list(session.scalars(query.limit(limit + 1)))
            session.expunge_all()
            more = len(rows) > limit
            rows = rows[:limit]
            return SearchPage(rows, encode_cursor(rows[-1]) if more and rows else None)
        marks = session.execute(window_marks(query, term)).all()
        hits = [mark.id for mark in marks if mark.hit][: limit + 1]
        by_id = {
            run.id: run for run in session.scalars(select(ToolRun).where(ToolRun.id.in_(hits)))
        }
        session.expunge_all()
    rows = [by_id[run_id] for run_id in hits if run_id in by_id]
    if len(rows) > limit:
        rows = rows[:limit]
        return SearchPage(rows, encode_cursor(rows[-1]))
    if len(marks) == TEXT_SEARCH_WINDOW:
        # The window was full: older runs may match too; go on from its oldest run.
        oldest = marks[-1]
        return SearchPage(
            rows,
            encode_cursor_parts(oldest.requested_at, oldest.id),
            searched_to=oldest.requested_at,
        )
    return SearchPage(rows, None)
