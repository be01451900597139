"""The submit form built from a tool's input schema: fields, reading them back, errors."""

from __future__ import annotations

from typing import Any

import pytest

from runyard.submission.schema_form import (
    WHOLE_INPUT,
    FormField,
    form_fields,
    form_values,
    read_form,
    schema_errors,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Who"},
        "count": {"type": "integer", "minimum": 1},
        "ratio": {"type": "number"},
        "loud": {"type": "boolean"},
        "colour": {"enum": ["red", 2, None]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}
FIELDS = form_fields(SCHEMA)


def test_form_fields__one_per_property_with_its_kind_and_whether_required():
    assert [(f.name, f.kind, f.required) for f in FIELDS] == [
        ("name", "string", True),
        ("count", "integer", True),
        ("ratio", "number", False),
        ("loud", "boolean", False),
        ("colour", "enum", False),
        ("tags", "json", False),
    ]
    assert FIELDS[0].description == "Who" and FIELDS[4].options == ("red", 2, None)


@pytest.mark.parametrize(
    "schema", [None, {}, {"type": "object"}, {"type": "array"}, {"type": "object", "properties": 3}]
)
def test_form_fields__none_for_schemas_without_properties(schema: Any):
    assert form_fields(schema) == []


@pytest.mark.parametrize(
    ("values", "expected", "errors"),
    [
        (
            {
                "name": "ann",
                "count": "3",
                "ratio": "0.5",
                "loud": "true",
                "colour": "1",
                "tags": '["a"]',
            },
            {"name": "ann", "count": 3, "ratio": 0.5, "loud": True, "colour": 2, "tags": ["a"]},
            {},
        ),
        (
            {"name": "", "count": "", "ratio": "", "loud": ""},
            {},
            {"name": "is required", "count": "is required"},
        ),
        (
            {
                "name": "x",
                "count": "1.5",
                "ratio": "nan",
                "colour": "9",
                "tags": "[",
                "loud": "yes",
            },
            {"name": "x"},
            {
                "count": "must be a whole number",
                "ratio": "must be a finite number",
                "colour": "choose one of the options",
                "tags": "is not valid JSON: Expecting value",
                "loud": "choose true or false",
            },
        ),
    ],
)
def test_read_form__makes_the_input_and_names_fields_it_cannot_read(
    values: dict[str, str], expected: dict[str, Any], errors: dict[str, str]
):
    assert read_form(FIELDS, values) == (expected, errors)


def test_schema_errors__one_per_field_and_missing_ones_by_name():
    assert schema_errors(SCHEMA, {"name": 1, "count": 0}) == {
        "count": "0 is less than the minimum of 1",
        "name": "1 is not of type 'string'",
    }
    assert schema_errors(SCHEMA, {"count": 2}) == {"name": "is required"}
    assert schema_errors(SCHEMA, {"name": "a", "count": 1, "extra": 1})[WHOLE_INPUT].startswith(
        "Additional properties"
    )
    assert schema_errors(None, {"anything": 1}) == {}


def test_form_values__shows_an_input_or_the_defaults_as_text():
    fields = [*FIELDS, FormField("level", "integer", False, default=3)]
    shown = form_values(fields, {"name": "a", "loud": False, "colour": None, "tags": ["x"]})
    assert shown == {
        "name": "a",
        "count": "",
        "ratio": "",
        "loud": "false",
        "colour": "2",
        "tags": '["x"]',
        "level": "3",
    }
