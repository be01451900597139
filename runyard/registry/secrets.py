"""A tool's secrets: references in the registry, values read by the process that creates the
container (never stored, logged or returned; docs/tools.md, "Secrets")."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
RESERVED_PREFIX = "RUNYARD_"
MAX_FILE_BYTES = 64 * 1024


class SecretUnavailable(Exception):
    """A secret's variable is unset or its file cannot be read; the message names the
    reference, never a value."""


def reference_problem(name: str, reference: str) -> str | None:
    """Why ``NAME = reference`` is not a valid registry entry, or None."""
    if not ENV_NAME.fullmatch(name):
        return f"secret name {name!r} is not an environment variable name"
    if name.startswith(RESERVED_PREFIX):
        return f"secret name {name!r}: the {RESERVED_PREFIX} prefix is the platform's"
    kind, _, target = reference.partition(":")
    if kind == "env":
        if not ENV_NAME.fullmatch(target):
            return f"secret {name}: {target!r} is not an environment variable name"
        return None
    if kind == "file":
        if not target.startswith("/") or "\x00" in target:
            return f"secret {name}: the file must be an absolute path"
        return None
    return f"secret {name}: the reference must be 'env:VAR' or 'file:/path'"


def _read_file(path: str) -> bytes:
    with Path(path).open("rb") as handle:
        return handle.read(MAX_FILE_BYTES + 1)


@dataclass(frozen=True)
class SecretSource:
    """Where the values come from: this process's environment and files."""

    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    read_file: Callable[[str], bytes] = _read_file

    def resolve(self, references: Mapping[str, str]) -> dict[str, str]:
        """``{NAME: value}`` for the container's environment; raises ``SecretUnavailable``."""
        values: dict[str, str] = {}
        for name, reference in sorted(references.items()):
            kind, _, target = reference.partition(":")
            if kind == "env":
                value = self.environ.get(target)
                if value is None:
                    raise SecretUnavailable(
                        f"secret {name}: environment variable {target} is not set"
                    )
            elif kind == "file":
                value = self._file_value(name, target)
            else:
                raise SecretUnavailable(f"secret {name}: unknown reference kind {kind!r}")
            values[name] = value
        return values

    def _file_value(self, name: str, path: str) -> str:
        try:
            data = self.read_file(path)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise SecretUnavailable(f"secret {name}: cannot read {path}: {reason}") from None
        if len(data) > MAX_FILE_BYTES:
            raise SecretUnavailable(f"secret {name}: {path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret {name}: {path} is not UTF-8 text") from None
        if "\x00" in text:
            raise SecretUnavailable(f"secret {name}: {path} contains a NUL byte")
        # One trailing newline is the file's, not the secret's (``echo value > file``).
        for ending in ("\r\n", "\n"):
            if text.endswith(ending):
                return text[: -len(ending)]
        return text
