"""The rules for a tool's artifacts, as pure functions: which paths and members are
accepted, how much may be kept, and what a refusal does to the run's outcome."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import ErrorCode, RunStatus

DEFAULT_MAX_MB = 100
MAX_FILES = 1000
# Directories are not kept, but each costs a walk: bounded like the files.
MAX_DIRECTORIES = 1000
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
RESULT_NAME = "result.json"


class Kind(enum.Enum):
    """What a member of /runyard/out is."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symbolic link"
    HARDLINK = "hard link"
    DEVICE = "device"
    FIFO = "FIFO"
    OTHER = "special file"


@dataclass(frozen=True)
class ArtifactLimits:
    """How much of /runyard/out a run may keep."""

    max_bytes: int
    max_files: int = MAX_FILES
    max_directories: int = MAX_DIRECTORIES

    @classmethod
    def of(cls, tool: dict[str, Any]) -> ArtifactLimits:
        """The limits of a run's tool snapshot (``artifacts_max_mb``, default 100)."""
        mb = tool.get("artifacts_max_mb")
        return cls(max_bytes=int(mb if mb is not None else DEFAULT_MAX_MB) << 20)


class ArtifactRefused(Exception):
    """The tool's outputs cannot be kept; ``code`` says why (invalid or over a limit)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def path_problem(path: str) -> str | None:
    """Why ``path`` (relative to /runyard/out) is not an acceptable artifact path, or None."""
    if not path:
        return "an empty path"
    if path.startswith("/"):
        return f"{_show(path)} is an absolute path"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return f"{_show(path)} is not UTF-8"
    if len(encoded) > MAX_PATH_BYTES:
        return f"{_show(path)} is longer than {MAX_PATH_BYTES} bytes"
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        return f"{_show(path)} holds a control character"
    for name in path.split("/"):
        if name in ("", ".", ".."):
            return f"{_show(path)} has an empty, '.' or '..' component"
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            return f"{_show(path)} has a name longer than {MAX_NAME_BYTES} bytes"
    return None


def member_problem(path: str, kind: Kind) -> str | None:
    """Why a member of /runyard/out cannot be kept: a bad path, or not a file or directory."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    if kind not in (Kind.FILE, Kind.DIRECTORY):
        return f"{_show(path)} is a {kind.value}; only regular files and directories are kept"
    return None


def is_result(path: str) -> bool:
    """``result.json`` at the top of /runyard/out is the result, not an artifact."""
    return path == RESULT_NAME


@dataclass
class Layout:
    """The paths of a set of files and the directories they need: each path must name one
    file, never a second one nor a directory another file is in (``deps/`` could not hold
    them, nor could a tar be unpacked). Only masking makes such paths out of a directory
    (``a-<value>`` and ``a-***``), or a set stored before this rule."""

    files: set[str] = dataclasses.field(default_factory=set)
    directories: set[str] = dataclasses.field(default_factory=set)

    def add(self, path: str) -> str | None:
        """Take the file ``path``, or say why it cannot be one of these files."""
        if path in self.files:
            return f"{_show(path)} names two files once secret values are masked"
        if path in self.directories:
            return (
                f"{_show(path)} names a file and a directory of other files once secret "
                "values are masked"
            )
        parents = _parents(path)
        clash = next((parent for parent in parents if parent in self.files), None)
        if clash is not None:
            return (
                f"{_show(path)} lies in {_show(clash)}, which is a file once secret values "
                "are masked"
            )
        self.files.add(path)
        self.directories.update(parents)
        return None


def layout_problem(paths: Iterable[str]) -> str | None:
    """Why ``paths`` cannot all be files of one directory tree (``Layout``), or None."""
    layout = Layout()
    for path in paths:
        problem = layout.add(path)
        if problem is not None:
            return problem
    return None


def _parents(path: str) -> list[str]:
    """``a/b/c`` → ``a/b``, ``a``."""
    parents = []
    cut = path.rfind("/")
    while cut > 0:
        path = path[:cut]
        parents.append(path)
        cut = path.rfind("/")
    return parents


@dataclass
class Tally:
    """What a collection has kept so far, checked against the limits before each member."""

    limits: ArtifactLimits
    files: int = 0
    bytes: int = 0
    directories: int = 0
    # The (masked) paths of the files kept, and the directories they are in.
    layout: Layout = dataclasses.field(default_factory=Layout)

    def admit(self, path: str, kind: Kind, size: int) -> None:
        """Count one member, or raise ``ArtifactRefused`` naming the rule or limit it breaks."""
        problem = member_problem(path, kind)
        if problem is None and kind is Kind.FILE:
            problem = self.layout.add(path)
        if problem is not None:
            raise ArtifactRefused(ErrorCode.INVALID_ARTIFACT, f"artifact refused: {problem}")
        if kind is Kind.DIRECTORY:
            self.directories += 1
            if self.directories > self.limits.max_directories:
                raise _over("directory", f"more than {self.limits.max_directories} directories")
            return
        if self.files + 1 > self.limits.max_files:
            raise _over("file count", f"more than {self.limits.max_files} files")
        if self.bytes + size > self.limits.max_bytes:
            mb = self.limits.max_bytes >> 20
            raise _over("size", f"more than {mb} MB in all (artifacts_max_mb = {mb})")
        self.files += 1
        self.bytes += size

    def grow(self, extra: int, *, settled: bool = False) -> None:
        """The file being kept is ``extra`` bytes longer than admitted (masking a value
        shorter than the mask): refuse past the size limit; ``settled`` counts it for good."""
        if extra <= 0:
            return
        if self.bytes + extra > self.limits.max_bytes:
            mb = self.limits.max_bytes >> 20
            raise _over("size", f"more than {mb} MB in all (artifacts_max_mb = {mb})")
        if settled:
            self.bytes += extra


def decide_artifacts(
    status: RunStatus, error_code: str | None, error: str | None, refused: ArtifactRefused | None
) -> tuple[RunStatus, str | None, str | None]:
    """The outcome after collecting: a success whose artifacts were refused fails with the
    refusal; any other outcome stays as it was (its artifacts, if refused, are dropped)."""
    if refused is None or status is not RunStatus.SUCCEEDED:
        return status, error_code, error
    return RunStatus.FAILED, refused.code.value, refused.message


def with_artifacts(
    outcome: AttemptResult, refused: ArtifactRefused | None, set_id: uuid.UUID | None
) -> AttemptResult:
    """``outcome`` (an ``AttemptResult``) after collecting: its set, or the refusal applied."""
    status, code, error = decide_artifacts(
        outcome.status, outcome.error_code, outcome.error, refused
    )
    return dataclasses.replace(
        outcome, status=status, error_code=code, error=error, artifact_set=set_id
    )


def _over(limit: str, what: str) -> ArtifactRefused:
    return ArtifactRefused(
        ErrorCode.ARTIFACTS_LIMIT, f"artifacts over the {limit} limit: {what} under /runyard/out"
    )


def show_path(path: str, limit: int = 80) -> str:
    """``path`` as error messages show it: quoted, escaped, cut after ``limit`` characters."""
    return _show(path, limit)


def _show(path: str, limit: int = 80) -> str:
    shown = path.encode("utf-8", errors="backslashreplace").decode("ascii", "backslashreplace")
    return repr(shown if len(shown) <= limit else shown[:limit] + "…")
