"""Opaque keyset cursors of a time and an id, as every paginated listing hands them out."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime


class BadCursor(Exception):
    """The pagination cursor is not one this API handed out."""


def encode_cursor_parts(stamp: datetime, row_id: uuid.UUID) -> str:
    """An opaque keyset cursor of a time and an id."""
    raw = f"{stamp.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor_parts(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Inverse of ``encode_cursor_parts``; raises ``BadCursor`` for anything else."""
    try:
        raw = base64.b64decode(
            cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True
        ).decode()
        stamp_text, _, run_id = raw.partition("|")
        stamp = datetime.fromisoformat(stamp_text)
        if stamp.tzinfo is None:
            raise ValueError("naive timestamp")
        return stamp, uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise BadCursor("the cursor is malformed; use next_cursor from a previous page") from exc
