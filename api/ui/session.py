"""Dashboard sessions: an API key, once checked, becomes a signed HttpOnly cookie.

The cookie holds the key's prefix, never its secret. Every request re-reads that key's row,
so revoking the key ends its dashboard sessions at once; the signature and the expiry stop a
forged or replayed cookie. Forms carry a CSRF token derived from the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine, text

from runyard.tenancy.auth import KEY_PREFIX, Principal, principal_of

COOKIE_NAME = "runyard_session"
COOKIE_PATH = "/ui"
_VERSION = "v1"

FIND_LIVE_KEY = text(
    "SELECT tenant, scopes, max_priority, tools FROM api_keys"
    " WHERE prefix = :prefix AND revoked_at IS NULL"
)


@dataclass(frozen=True)
class Session:
    """A verified session: who it is, and the token its forms must send back."""

    principal: Principal
    key_prefix: str
    csrf_token: str


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def key_prefix(api_key: str) -> str | None:
    """The lookup prefix of a well-formed key (``ry_<prefix>_<secret>``)."""
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1]:
        return None
    return parts[1]


class SessionSigner:
    """Signs and verifies session cookies with one secret (HMAC-SHA256)."""

    def __init__(self, secret: bytes, *, lifetime_seconds: float) -> None:
        if len(secret) < 32:
            raise ValueError("the session secret must be at least 32 bytes")
        self._secret = secret
        self.lifetime_seconds = lifetime_seconds

    def _mac(self, purpose: str, payload: str) -> str:
        message = f"{purpose}|{payload}".encode()
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def issue(self, prefix: str, *, now: float | None = None) -> str:
        """A cookie value for the key with this prefix, valid for the session lifetime."""
        expires = int((now if now is not None else time.time()) + self.lifetime_seconds)
        body = {"p": prefix, "e": expires, "n": secrets.token_urlsafe(12)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{_VERSION}.{payload}.{self._mac('session', payload)}"

    def open(self, cookie: str, *, now: float | None = None) -> tuple[str, str] | None:
        """``(key prefix, csrf token)`` of a genuine, unexpired cookie; None otherwise."""
        try:
            version, payload, mac = cookie.split(".")
        except ValueError:
            return None
        if version != _VERSION or not hmac.compare_digest(mac, self._mac("session", payload)):
            return None
        try:
            body = json.loads(_unb64(payload))
            prefix, expires, nonce = str(body["p"]), int(body["e"]), str(body["n"])
        except (ValueError, KeyError, TypeError):
            return None
        if expires <= (now if now is not None else time.time()):
            return None
        return prefix, self._mac("csrf", nonce)


def load_session(engine: Engine, signer: SessionSigner, cookie: str | None) -> Session | None:
    """The session a cookie stands for, if it is genuine and its key is still live."""
    if not cookie:
        return None
    opened = signer.open(cookie)
    if opened is None:
        return None
    prefix, csrf_token = opened
    with engine.connect() as conn:
        row = conn.execute(FIND_LIVE_KEY, {"prefix": prefix}).one_or_none()
    if row is None:
        return None
    return Session(principal=principal_of(row, prefix), key_prefix=prefix, csrf_token=csrf_token)


def same_token(sent: str | None, expected: str) -> bool:
    """Constant-time comparison of a submitted CSRF token."""
    return sent is not None and hmac.compare_digest(sent.encode(), expected.encode())
