"""Listing and revoking API keys (creating them is ``runyard.tenancy.auth``); never the hash."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from runyard.tenancy.auth import KEY_PREFIX, tools_problem

_COLUMNS = "prefix, tenant, name, scopes, max_priority, tools, created_at, last_used_at, revoked_at"
LIST_KEYS = text(
    f"""
    SELECT {_COLUMNS} FROM api_keys
    WHERE (revoked_at IS NULL OR :include_revoked)
    ORDER BY created_at DESC, prefix LIMIT :limit
    """
)
LIST_KEYS_OF_TENANT = text(
    f"""
    SELECT {_COLUMNS} FROM api_keys
    WHERE tenant = :tenant AND (revoked_at IS NULL OR :include_revoked)
    ORDER BY created_at DESC, prefix LIMIT :limit
    """
)
# Revoking twice keeps the first time; the second statement tells a revoked key from none.
REVOKE_KEY = text(
    """
    UPDATE api_keys SET revoked_at = coalesce(CAST(:now AS timestamptz), now())
    WHERE prefix = :prefix AND revoked_at IS NULL
    RETURNING revoked_at
    """
)
# NULL keeps a value; :all_tools lifts the key's tool list (every tool again).
UPDATE_KEY = text(
    """
    UPDATE api_keys
    SET max_priority = coalesce(CAST(:max_priority AS integer), max_priority),
        tools = CASE WHEN :all_tools THEN NULL
                     ELSE coalesce(CAST(:tools AS text[]), tools) END
    WHERE prefix = :prefix
    RETURNING """
    + _COLUMNS
)
KEY_REVOKED_AT = text("SELECT revoked_at FROM api_keys WHERE prefix = :prefix")

PREFIX_PATTERN = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class KeyInfo:
    """A key as operators see it: who it is for and when it was used, never its secret."""

    prefix: str
    tenant: str
    name: str | None
    scopes: list[str]
    max_priority: int
    tools: list[str] | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def prefix_of(value: str) -> str | None:
    """The lookup prefix of a prefix or of a whole key (``ry_<prefix>_<secret>``)."""
    parts = value.strip().split("_", 2)
    candidate = parts[1] if len(parts) == 3 and parts[0] == KEY_PREFIX else value.strip()
    return candidate if PREFIX_PATTERN.fullmatch(candidate) else None


def list_keys(
    engine: Engine,
    *,
    tenant: str | None = None,
    include_revoked: bool = False,
    limit: int = 200,
) -> list[KeyInfo]:
    """Keys, newest first; live ones only unless ``include_revoked``."""
    params = {"tenant": tenant, "include_revoked": include_revoked, "limit": limit}
    statement = LIST_KEYS if tenant is None else LIST_KEYS_OF_TENANT
    with engine.connect() as conn:
        rows = conn.execute(statement, params).all()
    return [_key_info(row) for row in rows]


def revoke_key(engine: Engine, prefix: str, *, now: datetime | None = None) -> datetime | None:
    """Revoke the key: when it was revoked (now or before), or None if there is no such key."""
    with engine.begin() as conn:
        revoked = conn.execute(REVOKE_KEY, {"prefix": prefix, "now": now}).scalar_one_or_none()
        if revoked is None:
            revoked = conn.execute(KEY_REVOKED_AT, {"prefix": prefix}).scalar_one_or_none()
    return revoked


def set_max_priority(engine: Engine, prefix: str, max_priority: int) -> KeyInfo | None:
    """Set the highest priority runs of this key may ask for; None: no such key."""
    return update_key(engine, prefix, max_priority=max_priority)


def update_key(
    engine: Engine,
    prefix: str,
    *,
    max_priority: int | None = None,
    tools: Sequence[str] | None = None,
    all_tools: bool = False,
) -> KeyInfo | None:
    """Change what is given (the highest priority, the tools it may run, or every tool
    again); None: no such key."""
    problem = tools_problem(tools)
    if problem is not None:
        raise ValueError(problem)
    params = {
        "prefix": prefix,
        "max_priority": max_priority,
        "tools": None if tools is None else sorted(set(tools)),
        "all_tools": all_tools,
    }
    with engine.begin() as conn:
        row = conn.execute(UPDATE_KEY, params).one_or_none()
    return None if row is None else _key_info(row)


def _key_info(row: Any) -> KeyInfo:
    """A key as its row reads."""
    return KeyInfo(
        prefix=row.prefix,
        tenant=row.tenant,
        name=row.name,
        scopes=list(row.scopes or []),
        max_priority=row.max_priority,
        tools=None if row.tools is None else list(row.tools),
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )
