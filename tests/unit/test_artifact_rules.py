"""The artifact rules: which paths and members are kept, the limits, and the outcome."""

from __future__ import annotations

import pytest

from runyard.artifacts.rules import (
    ArtifactLimits,
    ArtifactRefused,
    Kind,
    Tally,
    decide_artifacts,
    layout_problem,
    member_problem,
    path_problem,
)
from runyard.domain.states import ErrorCode, RunStatus


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("report.txt", None),
        ("a/b/c.bin", None),
        ("name with spaces & ünïcode.txt", None),
        (".hidden", None),
        ("a..b", None),
        ("", "an empty path"),
        ("/etc/passwd", "absolute"),
        ("../escape", "'..'"),
        ("a/../../b", "'..'"),
        ("a/./b", "'.'"),
        ("a//b", "empty"),
        ("a/", "empty"),
        ("tab\there", "control character"),
        ("new\nline", "control character"),
        ("x" * 256, "longer than 255"),
        ("/".join(["d" * 200] * 6), "longer than 1024"),
        ("bad\udcffbyte", "not UTF-8"),
    ],
)
def test_path_problem__table(path: str, problem: str | None):
    found = path_problem(path)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


@pytest.mark.parametrize(
    ("kind", "kept"),
    [
        (Kind.FILE, True),
        (Kind.DIRECTORY, True),
        (Kind.SYMLINK, False),
        (Kind.HARDLINK, False),
        (Kind.DEVICE, False),
        (Kind.FIFO, False),
        (Kind.OTHER, False),
    ],
)
def test_member_problem__only_files_and_directories(kind: Kind, kept: bool):
    problem = member_problem("x", kind)
    assert (problem is None) is kept
    if not kept:
        assert kind.value in str(problem)


def test_limits__of_a_tool_default_and_own():
    assert ArtifactLimits.of({}).max_bytes == 100 << 20
    assert ArtifactLimits.of({"artifacts_max_mb": 3}).max_bytes == 3 << 20
    assert ArtifactLimits.of({}).max_files == 1000


def test_tally__file_count_limit_names_the_limit():
    tally = Tally(ArtifactLimits(max_bytes=1 << 20, max_files=2))
    tally.admit("a", Kind.FILE, 1)
    tally.admit("b", Kind.FILE, 1)
    with pytest.raises(ArtifactRefused) as refused:
        tally.admit("c", Kind.FILE, 1)
    assert refused.value.code is ErrorCode.ARTIFACTS_LIMIT
    assert (
        "file count limit" in refused.value.message and "more than 2 files" in refused.value.message
    )


def test_tally__size_limit_counts_the_total_and_names_the_limit():
    tally = Tally(ArtifactLimits(max_bytes=1 << 20))
    tally.admit("a", Kind.FILE, 1 << 19)
    tally.admit("b", Kind.FILE, 1 << 19)  # exactly at the limit: kept
    with pytest.raises(ArtifactRefused) as refused:
        tally.admit("c", Kind.FILE, 1)
    assert refused.value.code is ErrorCode.ARTIFACTS_LIMIT
    assert "size limit" in refused.value.message and "artifacts_max_mb = 1" in refused.value.message
    assert (tally.files, tally.bytes) == (2, 1 << 20)


def test_tally__directories_are_bounded_but_not_files():
    tally = Tally(ArtifactLimits(max_bytes=10, max_files=1, max_directories=2))
    tally.admit("d", Kind.DIRECTORY, 4096)
    tally.admit("d/e", Kind.DIRECTORY, 4096)
    tally.admit("d/e/f", Kind.FILE, 10)
    with pytest.raises(ArtifactRefused, match="directory limit"):
        tally.admit("g", Kind.DIRECTORY, 4096)


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        (["a", "b", "c/d", "c/e/f"], None),
        (["a/b", "a/bc", "ab/c", "a-b"], None),  # a prefix that is no directory of another
        (["x", "x"], "'x' names two files"),
        (["a-***", "a-***/f"], "'a-***/f' lies in 'a-***', which is a file"),
        (["a-***/f", "a-***"], "'a-***' names a file and a directory of other files"),
        (["d/e/f/g", "d/e"], "'d/e' names a file and a directory"),
        (["d/e", "d/e/f/g"], "'d/e/f/g' lies in 'd/e'"),
    ],
)
def test_layout_problem__a_path_names_one_file_never_a_directory_too(
    paths: list[str], problem: str | None
):
    found = layout_problem(paths)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_tally__a_file_where_another_files_directory_is_is_refused():
    tally = Tally(ArtifactLimits(max_bytes=1 << 20))
    tally.admit("a-***", Kind.DIRECTORY, 0)  # an empty directory is not kept: no clash
    tally.admit("a-***", Kind.FILE, 1)
    with pytest.raises(ArtifactRefused) as caught:
        tally.admit("a-***/f", Kind.FILE, 1)
    assert caught.value.code is ErrorCode.INVALID_ARTIFACT
    assert "once secret values are masked" in caught.value.message


def test_tally__a_link_is_invalid_not_a_limit():
    with pytest.raises(ArtifactRefused) as refused:
        Tally(ArtifactLimits(max_bytes=10)).admit("x", Kind.SYMLINK, 0)
    assert refused.value.code is ErrorCode.INVALID_ARTIFACT


REFUSED = ArtifactRefused(ErrorCode.ARTIFACTS_LIMIT, "too many")


@pytest.mark.parametrize(
    ("status", "code", "refused", "expected"),
    [
        (RunStatus.SUCCEEDED, None, None, (RunStatus.SUCCEEDED, None, None)),
        (
            RunStatus.SUCCEEDED,
            None,
            REFUSED,
            (RunStatus.FAILED, "artifacts_limit_exceeded", "too many"),
        ),
        (
            RunStatus.FAILED,
            "tool_failed",
            REFUSED,
            (RunStatus.FAILED, "tool_failed", "err"),
        ),
        (
            RunStatus.TIMED_OUT,
            "timed_out",
            REFUSED,
            (RunStatus.TIMED_OUT, "timed_out", "err"),
        ),
    ],
)
def test_decide_artifacts__only_a_success_fails_for_its_artifacts(
    status: RunStatus,
    code: str | None,
    refused: ArtifactRefused | None,
    expected: tuple[RunStatus, str | None, str | None],
):
    error = None if code is None else "err"
    assert decide_artifacts(status, code, error, refused) == expected
