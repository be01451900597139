"""The one read model of a run: its statement, its public schema and its refusals agree."""

from __future__ import annotations

import dataclasses
import re

import pytest

from api.schemas import RUN_EXAMPLE, RunOut
from runyard.reads.run_view import RUN_VIEW, RunView

FIELDS = [field.name for field in dataclasses.fields(RunView)]


def test_run_view__its_statement_selects_exactly_its_fields():
    select = re.search(r"SELECT(.*?)FROM", RUN_VIEW.text, re.S)
    assert select is not None
    assert [name.strip() for name in select.group(1).split(",")] == FIELDS


def test_run_out__is_the_read_model_with_nothing_added():
    assert [field.name for field in dataclasses.fields(RunOut)] == FIELDS
    assert set(RunOut.__pydantic_fields__) == set(FIELDS)  # type: ignore[attr-defined]


def test_run_view__of_takes_the_public_fields_of_any_row_and_nothing_else():
    example = RunOut(**RUN_EXAMPLE)  # the documented example fits the shape
    values = dataclasses.asdict(example)
    row = type("Row", (), {**values, "tenant": "secret", "stdout": "x", "spec": {}})()
    view = RunView.of(row)
    assert type(view) is RunView and dataclasses.asdict(view) == values
    assert RunOut.of(view) == example


@pytest.mark.parametrize("name", ["tenant", "spec", "stdout", "stderr", "lease_token"])
def test_run_out__never_shows(name: str):
    assert name not in FIELDS
