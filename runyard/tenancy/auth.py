"""API keys: random secrets shown once, stored as SHA-256, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

logger = logging.getLogger(__name__)

KEY_PREFIX = "ry"
ADMIN_SCOPE = "admin"
# A verified key is trusted this long without asking the database again, so a revoked key
# keeps working for at most this many seconds in each API process (docs/operations.md).
AUTH_CACHE_SECONDS = 5.0
AUTH_CACHE_MAX_KEYS = 4096
# ``api_keys.last_used_at`` is written at most this often per key, whatever the traffic.
LAST_USED_EVERY_SECONDS = 60.0

INSERT_KEY = text(
    """
    INSERT INTO api_keys (id, prefix, key_hash, tenant, name, scopes, max_priority, tools)
    VALUES (:id, :prefix, :key_hash, :tenant, :name, :scopes, :max_priority,
            CAST(:tools AS text[]))
    RETURNING created_at
    """
)
# ``stale``: the key's last use is older than the interval, so this use is worth writing.
FIND_KEY = text(
    """
    SELECT key_hash, tenant, scopes, max_priority, tools,
           (last_used_at IS NULL OR last_used_at
               <= coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :every))
               AS stale
    FROM api_keys WHERE prefix = :prefix AND revoked_at IS NULL
    """
)
# The same condition again inside the UPDATE: of API processes that race, one writes.
TOUCH_KEY = text(
    """
    UPDATE api_keys SET last_used_at = coalesce(CAST(:now AS timestamptz), now())
    WHERE prefix = :prefix AND revoked_at IS NULL
      AND (last_used_at IS NULL OR last_used_at
           <= coalesce(CAST(:now AS timestamptz), now()) - make_interval(secs => :every))
    """
)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, and whether it may see every tenant's runs."""

    tenant: str
    admin: bool = False
    # The key's lookup prefix (None with auth disabled): what a revoke names.
    key_prefix: str | None = None
    # The highest priority this key may ask for (admins: any).
    max_priority: int = 0
    # The tools this key may run (None: every tool).
    tools: frozenset[str] | None = None


def priority_ceiling(principal: Principal) -> int | None:
    """The highest priority ``principal`` may submit at; None: no bound (an admin)."""
    return None if principal.admin else principal.max_priority


def may_run(principal: Principal, tool: str) -> bool:
    """Whether ``principal``'s key may run (list, schedule) ``tool``."""
    return principal.tools is None or tool in principal.tools


MAX_KEY_TOOLS = 256


def tools_problem(tools: Sequence[str] | None) -> str | None:
    """Why a key's tool list is refused (None: it is fine; None as a list: every tool)."""
    if tools is None:
        return None
    if not tools:
        return "tools must name at least one tool (leave it out for every tool)"
    if len(tools) > MAX_KEY_TOOLS:
        return f"tools may name at most {MAX_KEY_TOOLS} tools"
    if any(not t or len(t) > 128 for t in tools):
        return "each tool name must be 1 to 128 characters"
    return None


@dataclass(frozen=True)
class IssuedKey:
    """A key just created: the only time its secret is seen."""

    key: str
    prefix: str
    tenant: str
    name: str | None
    scopes: list[str]
    created_at: datetime
    max_priority: int = 0
    tools: list[str] | None = None


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_api_key(
    engine: Engine,
    tenant: str,
    *,
    admin: bool = False,
    name: str | None = None,
    max_priority: int = 0,
    tools: Sequence[str] | None = None,
) -> IssuedKey:
    """Store a new key for ``tenant`` (limited to ``tools`` if given); the returned secret
    cannot be recovered later."""
    if not tenant or len(tenant) > 128:
        raise ValueError("tenant must be 1 to 128 characters")
    if name is not None and len(name) > 200:
        raise ValueError("name must be at most 200 characters")
    problem = tools_problem(tools)
    if problem is not None:
        raise ValueError(problem)
    listed = None if tools is None else sorted(set(tools))
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    scopes = [ADMIN_SCOPE] if admin else []
    with engine.begin() as conn:
        created_at = conn.execute(
            INSERT_KEY,
            {
                "id": uuid.uuid4(),
                "prefix": prefix,
                "key_hash": _hash(secret),
                "tenant": tenant,
                "name": name,
                "scopes": scopes,
                "max_priority": max_priority,
                "tools": listed,
            },
        ).scalar_one()
    return IssuedKey(
        key=f"{KEY_PREFIX}_{prefix}_{secret}",
        prefix=prefix,
        tenant=tenant,
        name=name,
        scopes=scopes,
        created_at=created_at,
        max_priority=max_priority,
        tools=listed,
    )


def create_api_key(
    engine: Engine,
    tenant: str,
    *,
    admin: bool = False,
    name: str | None = None,
    tools: Sequence[str] | None = None,
) -> str:
    """Store a new key for ``tenant`` and return it; it cannot be recovered later."""
    return issue_api_key(engine, tenant, admin=admin, name=name, tools=tools).key


def authenticate(
    engine: Engine,
    presented: str,
    *,
    now: datetime | None = None,
    touch_every: float = LAST_USED_EVERY_SECONDS,
) -> Principal | None:
    """The principal a key belongs to, or None for an unknown, revoked or malformed key.

    A verified key's ``last_used_at`` is written when it is older than ``touch_every``; a
    failure to write it is logged, never a reason to refuse the key.
    """
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        return None
    _, prefix, secret = parts
    params = {"prefix": prefix, "now": now, "every": touch_every}
    with engine.connect() as conn:
        row = conn.execute(FIND_KEY, params).one_or_none()
        if row is None:
            # Same work as a hit, so timing does not tell a known prefix from an unknown one.
            hmac.compare_digest(_hash(secret), _hash(""))
            return None
        if not hmac.compare_digest(row.key_hash, _hash(secret)):
            return None
        if row.stale:
            try:
                conn.execute(TOUCH_KEY, params)
                conn.commit()
            except SQLAlchemyError:
                logger.warning("could not record the key's last use", extra={"key": prefix})
    return principal_of(row, prefix)


def principal_of(row: Any, prefix: str) -> Principal:
    """Who a key's row (tenant, scopes, max_priority, tools) stands for."""
    return Principal(
        tenant=row.tenant,
        admin=ADMIN_SCOPE in (row.scopes or []),
        key_prefix=prefix,
        max_priority=row.max_priority,
        tools=None if row.tools is None else frozenset(row.tools),
    )


class PrincipalCache:
    """Keys verified within the last ``ttl_seconds``, by the SHA-256 of the whole key.

    Only hits are kept (an unknown key is asked for again every time, so guessing fills no
    memory), at most ``max_keys`` of them; the secret itself is never stored.
    """

    def __init__(
        self,
        ttl_seconds: float = AUTH_CACHE_SECONDS,
        max_keys: int = AUTH_CACHE_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_seconds
        self._max = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, presented: str) -> Principal | None:
        """The principal of a key verified less than ``ttl_seconds`` ago, else None."""
        digest = _hash(presented)
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if self._clock() >= entry[0]:
                del self._entries[digest]
                return None
            return entry[1]

    def forget(self, key_prefix: str) -> None:
        """Drop the key with this prefix (just revoked): this process refuses it at once."""
        with self._lock:
            for digest in [d for d, (_, p) in self._entries.items() if p.key_prefix == key_prefix]:
                del self._entries[digest]

    def put(self, presented: str, principal: Principal) -> None:
        """Remember a key the database just verified."""
        if self._ttl <= 0:
            return
        digest = _hash(presented)
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self._max:
                # Drop what has expired; if that frees nothing, the oldest entry.
                for key in [k for k, (until, _) in self._entries.items() if until <= now]:
                    del self._entries[key]
                if len(self._entries) >= self._max:
                    del self._entries[next(iter(self._entries))]
            self._entries[digest] = (now + self._ttl, principal)
