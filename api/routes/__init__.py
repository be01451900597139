"""The JSON API's routes, one module per resource; they call ``api.actions``, never each
other. What several of them document or parse the same way is here."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header

from api.openapi import problem

RUN_NOT_FOUND = problem("No such run, or it belongs to another tenant")
# The header of every submit (a run, a batch): retries with the same key and body get the
# first answer's resource.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Retries with the same key and body return the first run or batch",
    ),
]
