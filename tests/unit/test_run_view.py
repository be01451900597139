"""The one read model of a run: its statement, its public schema and its refusals agree."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from api.schemas import RunOut
from runyard.models import RunStatus
from runyard.runs import RUN_VIEW, RunView

FIELDS = [field.name for field in dataclasses.fields(RunView)]


def test_run_view__its_statement_selects_exactly_its_fields():
    select = re.search(r"SELECT(.*?)FROM", RUN_VIEW.text, re.S)
    assert select is not None
    assert [name.strip() for name in select.group(1).split(",")] == FIELDS


def test_run_out__is_the_read_model_with_nothing_added():
    assert [field.name for field in dataclasses.fields(RunOut)] == FIELDS
    assert set(RunOut.__pydantic_fields__) == set(FIELDS)  # type: ignore[attr-defined]


def test_run_view__of_takes_the_public_fields_of_any_row_and_nothing_else():
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tool": "echo",
        "status": RunStatus.SUCCEEDED,
        "mode": "sync",
        "input": {"a": 1},
        "result": {"a": 1},
        "exit_code": 0,
        "attempts": 1,
        "max_attempts": 1,
        "error_code": None,
        "error": None,
        "stdout_truncated": False,
        "stderr_truncated": True,
        "requested_at": datetime(2030, 1, 1, tzinfo=UTC),
        "started_at": None,
        "finished_at": None,
    }
    row = type("Row", (), {**values, "tenant": "secret", "stdout": "x", "spec": {}})()
    view = RunView.of(row)
    assert dataclasses.asdict(view) == values
    assert RunOut.of(view) == RunOut(**values)


@pytest.mark.parametrize("name", ["tenant", "spec", "stdout", "stderr", "lease_token"])
def test_run_out__never_shows(name: str):
    assert name not in FIELDS
