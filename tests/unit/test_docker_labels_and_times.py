"""Reading back what the engine keeps: an attempt's labels, and the engine's timestamps."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from runyard.runners.docker.engine_calls import parse_docker_time
from runyard.runners.docker.labels import LABEL_ATTEMPT, LABEL_RUN_ID, attempt_of

RUN_ID = uuid.UUID("0b7f2b4e-8c1d-4f6a-9e3b-2d5c7a1e9f00")


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({LABEL_RUN_ID: str(RUN_ID), LABEL_ATTEMPT: "2"}, (RUN_ID, 2)),
        ({LABEL_RUN_ID: str(RUN_ID)}, None),
        ({LABEL_ATTEMPT: "1"}, None),
        ({LABEL_RUN_ID: "not-a-uuid", LABEL_ATTEMPT: "1"}, None),
        ({LABEL_RUN_ID: str(RUN_ID), LABEL_ATTEMPT: "first"}, None),
        ({}, None),
    ],
)
def test_attempt_of__names_the_attempt_only_when_both_labels_read(
    labels: dict[str, str], expected: tuple[uuid.UUID, int] | None
):
    assert attempt_of(labels) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # The engine writes nanoseconds; microseconds are kept.
        (
            "2026-11-26T03:24:44.123456789Z",
            datetime(2026, 11, 26, 3, 24, 44, 123456, tzinfo=UTC),
        ),
        ("2026-11-26T03:24:44.5Z", datetime(2026, 11, 26, 3, 24, 44, 500000, tzinfo=UTC)),
        ("2026-11-26T03:24:44Z", datetime(2026, 11, 26, 3, 24, 44, tzinfo=UTC)),
        # Docker's zero time: the container never started (or never finished).
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_docker_time__reads_the_engines_stamps(value: str | None, expected: datetime | None):
    assert parse_docker_time(value) == expected
