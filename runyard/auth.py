"""API keys: random secrets shown once, stored as SHA-256, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, text

KEY_PREFIX = "ry"
ADMIN_SCOPE = "admin"

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
