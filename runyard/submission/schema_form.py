"""A form built from a tool's ``input_schema``: one field per top-level property (string,
number, integer, boolean, enum; anything else a JSON box), the form's values read back into
an input, and the schema's complaints sorted by field. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

# Field kinds; "json" is the fallback for objects, arrays and anything mixed.
SIMPLE_KINDS = ("string", "number", "integer", "boolean")
# Past this many properties the raw JSON box is the better form.
MAX_FIELDS = 40
# Errors that belong to no single field.
WHOLE_INPUT = ""


@dataclass(frozen=True)
class FormField:
    """One top-level property as a form field."""

    name: str
    kind: str  # string, number, integer, boolean, enum or json
    required: bool
    description: str | None = None
    options: tuple[Any, ...] = ()  # an enum's values, in the schema's order
    default: Any = None


def _kind(spec: Mapping[str, Any]) -> str:
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return "enum"
    kind = spec.get("type")
    return kind if isinstance(kind, str) and kind in SIMPLE_KINDS else "json"


def form_fields(schema: Mapping[str, Any] | None) -> list[FormField]:
    """The fields of an object schema with properties; none for any other schema."""
    if not schema or schema.get("type") != "object":
        return []
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties or len(properties) > MAX_FIELDS:
        return []
    required = set(schema.get("required") or [])
    fields = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, dict) else {}
        description = spec.get("description")
        fields.append(
            FormField(
                name=str(name),
                kind=_kind(spec),
                required=name in required,
                description=description if isinstance(description, str) else None,
                options=tuple(spec["enum"]) if _kind(spec) == "enum" else (),
                default=spec.get("default"),
            )
        )
    return fields


def _number(text: str, integer: bool) -> int | float:
    try:
        return int(text)
    except ValueError:
        if integer:
            raise ValueError("must be a whole number") from None
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("must be a finite number")
    return value


def _value(field: FormField, text: str) -> Any:
    if field.kind == "string":
        return text
    if field.kind in ("number", "integer"):
        return _number(text.strip(), field.kind == "integer")
    if field.kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError("choose true or false")
        return text == "true"
    if field.kind == "enum":
        if not text.isdigit() or int(text) >= len(field.options):
            raise ValueError("choose one of the options")
        return field.options[int(text)]
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON: {exc.msg}") from None


def read_form(
    fields: list[FormField], values: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The input the form's values make (an empty optional field is left out) and the
    fields whose value could not be read, with why."""
    result: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        text = values.get(field.name, "")
        if text == "":
            if field.required:
                errors[field.name] = "is required"
            continue
        try:
            result[field.name] = _value(field, text)
        except ValueError as exc:
            errors[field.name] = str(exc)
    return result, errors


def schema_errors(schema: Mapping[str, Any] | None, value: Any) -> dict[str, str]:
    """Every complaint of the schema about ``value``, one per top-level property (the first
    in the input's order); complaints about the whole input under ``WHOLE_INPUT``."""
    if not schema:
        return {}
    validator = jsonschema.Draft202012Validator(schema)
    errors: dict[str, str] = {}
    for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path))):
        path = list(error.absolute_path)
        where = str(path[0]) if path else WHOLE_INPUT
        message = error.message
        if not path and error.validator == "required" and isinstance(error.instance, dict):
            missing = [n for n in schema.get("required", []) if n not in error.instance]
            if missing:
                where, message = str(missing[0]), "is required"
        errors.setdefault(where, message)
    return errors


def form_values(fields: list[FormField], value: Any) -> dict[str, str]:
    """The form's text for an input (to show a form again as it was sent, or a default)."""
    source = value if isinstance(value, dict) else {}
    shown: dict[str, str] = {}
    for field in fields:
        given = field.name in source
        item = source[field.name] if given else field.default
        if field.kind == "enum":
            chosen = given or field.default is not None
            shown[field.name] = (
                str(field.options.index(item)) if chosen and item in field.options else ""
            )
        elif item is None:
            shown[field.name] = ""
        elif field.kind == "boolean":
            shown[field.name] = "true" if item is True else "false" if item is False else ""
        elif field.kind == "string" and isinstance(item, str):
            shown[field.name] = item
        elif field.kind in ("number", "integer") and isinstance(item, int | float):
            shown[field.name] = str(item)
        else:
            shown[field.name] = json.dumps(item)
    return shown
