"""Resolving a tool's secret references from the process's environment and files."""

from __future__ import annotations

from pathlib import Path

import pytest

from runyard.registry.secrets import MAX_FILE_BYTES, SecretSource, SecretUnavailable


def test_resolve__env_and_file(tmp_path: Path):
    path = tmp_path / "cert"
    path.write_text("line1\nline2\n")
    source = SecretSource(environ={"TOOL_TOKEN": "t0k"})
    values = source.resolve({"TOKEN": "env:TOOL_TOKEN", "CERT": f"file:{path}"})
    assert values == {"TOKEN": "t0k", "CERT": "line1\nline2"}


@pytest.mark.parametrize(
    ("content", "value"),
    [(b"abc", "abc"), (b"abc\n", "abc"), (b"abc\r\n", "abc"), (b"abc\n\n", "abc\n")],
)
def test_resolve__one_trailing_newline_is_dropped(tmp_path: Path, content: bytes, value: str):
    path = tmp_path / "s"
    path.write_bytes(content)
    assert SecretSource(environ={}).resolve({"S": f"file:{path}"}) == {"S": value}


def test_resolve__missing_env_var_names_the_reference_not_a_value():
    source = SecretSource(environ={"OTHER": "x"})
    with pytest.raises(SecretUnavailable, match="secret TOKEN: environment variable T is not set"):
        source.resolve({"TOKEN": "env:T"})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read .*: No such file or directory"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"a\x00b", "contains a NUL byte"),
        (b"x" * (MAX_FILE_BYTES + 1), "is larger than"),
    ],
)
def test_resolve__an_unusable_file_fails_clearly(
    tmp_path: Path, content: bytes | None, message: str
):
    path = tmp_path / "s"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SecretUnavailable, match=message):
        SecretSource(environ={}).resolve({"S": f"file:{path}"})


def test_resolve__an_unreadable_file_fails_clearly(tmp_path: Path):
    def denied(path: str) -> bytes:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(SecretUnavailable, match="cannot read /x: Permission denied"):
        SecretSource(environ={}, read_file=denied).resolve({"S": "file:/x"})
