"""Which idempotency key an MCP tool call submits under (decision record 0027).

An explicit key in the call's ``_meta`` wins: a client that retries after its connection
dropped usually does so on a new session, where only a key it chose itself is the same.
Without one, a call on a stateful session gets a key derived from the session and the
JSON-RPC request id, so the same request sent again on that session is not run twice. A
call with neither (stateless requests, whose request ids repeat across connections) gets no
key: two such calls are two runs. The queue scopes every key to the caller's tenant.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

# The ``_meta`` entries a client may name its key with: the namespaced one, and the plain
# spelling a person writes by hand.
META_KEYS = ("io.runyard/idempotency_key", "idempotency_key")
MAX_KEY_LENGTH = 255
DERIVED_PREFIX = "mcp-"


class BadIdempotencyKey(ValueError):
    """The ``_meta`` key is not 1 to 255 printable ASCII characters."""


def call_idempotency_key(
    meta: Mapping[str, Any] | None, session_id: str | None, request_id: str | int | None
) -> str | None:
    """The key a call submits under: the explicit one, else one derived from the session and
    the request id, else None. Raises ``BadIdempotencyKey`` for an unusable explicit key."""
    for name in META_KEYS:
        value = (meta or {}).get(name)
        if value is not None:
            return _checked(name, value)
    if session_id is None or request_id is None:
        return None
    # JSON-RPC ids may be numbers or strings: 7 and "7" are different requests.
    material = f"{session_id}\n{type(request_id).__name__}:{request_id}"
    return DERIVED_PREFIX + hashlib.sha256(material.encode()).hexdigest()


def _checked(name: str, value: Any) -> str:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_KEY_LENGTH
        or not all("\x21" <= c <= "\x7e" for c in value)
    ):
        raise BadIdempotencyKey(
            f"_meta.{name} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters, no spaces"
        )
    return value
