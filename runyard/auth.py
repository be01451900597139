"""API keys: random secrets shown once, stored as SHA-256, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, text

KEY_PREFIX = "ry"
ADMIN_SCOPE = "admin"
# A verified key is trusted this long without asking the database again, so a revoked key
# keeps working for at most this many seconds in each API process (docs/operations.md).
AUTH_CACHE_SECONDS = 5.0
AUTH_CACHE_MAX_KEYS = 4096

INSERT_KEY = text(
    """
    INSERT INTO api_keys (id, prefix, key_hash, tenant, name, scopes)
    VALUES (:id, :prefix, :key_hash, :tenant, :name, :scopes)
    """
)
FIND_KEY = text(
    "SELECT key_hash, tenant, scopes FROM api_keys WHERE prefix = :prefix AND revoked_at IS NULL"
)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant, and whether it may see every tenant's runs."""

    tenant: str
    admin: bool = False


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_key(
    engine: Engine, tenant: str, *, admin: bool = False, name: str | None = None
) -> str:
    """Store a new key for ``tenant`` and return it; it cannot be recovered later."""
    if not tenant or len(tenant) > 128:
        raise ValueError("tenant must be 1 to 128 characters")
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            INSERT_KEY,
            {
                "id": uuid.uuid4(),
                "prefix": prefix,
                "key_hash": _hash(secret),
                "tenant": tenant,
                "name": name,
                "scopes": [ADMIN_SCOPE] if admin else [],
            },
        )
    return f"{KEY_PREFIX}_{prefix}_{secret}"


def authenticate(engine: Engine, presented: str) -> Principal | None:
    """The principal a key belongs to, or None for an unknown, revoked or malformed key."""
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        return None
    _, prefix, secret = parts
    with engine.connect() as conn:
        row = conn.execute(FIND_KEY, {"prefix": prefix}).one_or_none()
    if row is None:
        # Same work as a hit, so timing does not tell a known prefix from an unknown one.
        hmac.compare_digest(_hash(secret), _hash(""))
        return None
    if not hmac.compare_digest(row.key_hash, _hash(secret)):
        return None
    return Principal(tenant=row.tenant, admin=ADMIN_SCOPE in (row.scopes or []))


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
