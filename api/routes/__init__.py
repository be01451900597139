"""The JSON API's routes, one module per resource; they call ``api.actions``, never each
other. What several of them document or parse the same way is here."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query

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

# The most a request may ask to wait; RUNYARD_MAX_WAIT_SECONDS caps it lower.
MAX_WAIT_QUERY = 3600.0
# The long-poll of a submit and of the reads of a run and of a batch: one parameter, one rule.
WaitSeconds = Annotated[
    float,
    Query(
        ge=0,
        le=MAX_WAIT_QUERY,
        allow_inf_nan=False,
        description="Seconds to hold the answer until the run (or batch) is terminal, 0 to "
        "3600, capped by RUNYARD_MAX_WAIT_SECONDS (60 by default); it answers as soon as it "
        "is, else after the wait with the status reached then",
    ),
]
