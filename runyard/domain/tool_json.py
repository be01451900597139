"""The one gate for JSON written by tools: strict RFC 8259, bounded depth, storable in jsonb.

A tool's ``result.json`` is hostile input. Python's ``json`` accepts ``NaN``, ``Infinity``,
numbers that overflow to infinity and lone surrogates; Postgres ``jsonb`` refuses them, and
pydantic and ``json.dumps`` cannot serialize documents nested deeper than a few hundred
levels. ``decode_tool_json`` refuses all of these with a message a person understands, before
anything reaches the database. ``load_stored_json`` is the read side: every jsonb value the
database hands back passes through it, so a row stored before these bounds existed is still
served, never a 500.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

DEFAULT_MAX_DEPTH = 64
# The deepest document any read serves as is; deeper stored rows are replaced by a marker.
# A run response nests its result two levels down, well inside serializers' limits (255).
MAX_STORED_DEPTH = 128
UNREADABLE_KEY = "runyard_unreadable"

# NUL cannot be held by jsonb; surrogates cannot be encoded as UTF-8.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class ToolJsonError(ValueError):
    """The document is not JSON runyard accepts from a tool."""


class _Constant(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ToolJsonError(f"the number {_short(text)} is out of range")
    return value


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _line_of_constant(text: str) -> int:
    """The line of the first NaN/Infinity outside a string (only called on the error path)."""
    in_string = escaped = False
    line = 1
    for index, char in enumerate(text):
        if char == "\n":
            line += 1
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "NI" and text.startswith(("NaN", "Infinity"), index):
            return line
    return line


def _describe(value: str) -> str:
    match = _UNSTORABLE.search(value)
    assert match is not None
    char = match.group()
    if char == "\x00":
        return "a string holds \\u0000, which cannot be stored"
    return f"a string holds a lone surrogate \\u{ord(char):04x}, which is not Unicode text"


def check_tree(value: Any, max_depth: int) -> str | None:
    """Why ``value`` cannot be stored and served (depth, unstorable strings), or None."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                return f"it nests deeper than {max_depth} levels"
            for key, child in node.items():
                if _UNSTORABLE.search(key):
                    return _describe(key)
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif isinstance(child, str) and _UNSTORABLE.search(child):
                    return _describe(child)
        elif isinstance(node, list):
            if depth > max_depth:
                return f"it nests deeper than {max_depth} levels"
            for child in node:
                if isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif isinstance(child, str) and _UNSTORABLE.search(child):
                    return _describe(child)
        elif isinstance(node, str) and _UNSTORABLE.search(node):
            return _describe(node)
    return None


def decode_tool_json(data: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse ``data`` as strict JSON a tool wrote; ``ToolJsonError`` says what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolJsonError(f"it is not UTF-8 text (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise ToolJsonError("it starts with a byte order mark, which JSON does not allow")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _Constant as exc:
        raise ToolJsonError(f"{exc.name} is not JSON at line {_line_of_constant(text)}") from None
    except RecursionError:
        raise ToolJsonError(f"it nests deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise ToolJsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # ToolJsonError from parse_float, or too many integer digits
        raise ToolJsonError(str(exc)) from None
    problem = check_tree(value, max_depth)
    if problem is not None:
        raise ToolJsonError(problem)
    return value


def decode_result(data: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[Any, str | None]:
    """``result.json``'s document, or why it was refused (``"result.json: …"``)."""
    try:
        return decode_tool_json(data, max_depth=max_depth), None
    except ToolJsonError as exc:
        return None, f"result.json: {exc}"


def unreadable(why: str) -> dict[str, str]:
    """What a read serves in place of a stored document it cannot serve as is."""
    return {UNREADABLE_KEY: why}


def load_stored_json(text: str | bytes) -> Any:
    """The read side's jsonb loader: deep or broken stored documents become a marker."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except RecursionError:
        return unreadable(f"the stored document nests deeper than {MAX_STORED_DEPTH} levels")
    except ValueError as exc:
        return unreadable(f"the stored document could not be read: {exc}")
    # Only a document with that many brackets can be that deep: skip the walk otherwise.
    if text.count("[") + text.count("{") > MAX_STORED_DEPTH:
        problem = check_tree(value, MAX_STORED_DEPTH)
        if problem is not None and "deeper" in problem:
            return unreadable(f"the stored document {problem.removeprefix('it ')}")
    return value
