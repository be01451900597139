"""The sandbox rules (``runyard.domain.sandboxes``) and the poll answer of the engine port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runyard.domain.sandboxes import (
    WORKSPACE,
    EndFacts,
    EndReason,
    command_problem,
    complete_utf8,
    end_of,
    env_problem,
    event_id,
    exec_timed_out,
    idle_passed,
    parse_event_id,
    reason_of,
    startable,
    workspace_dir,
)
from runyard.domain.states import RunStatus
from runyard.sandbox_engine import ExecFiles, parse_poll

T0 = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)


def facts(**more: object) -> EndFacts:
    values: dict[str, object] = {
        "delete_requested": False,
        "ttl_passed": False,
        "idle_passed": False,
        "exit_code": 0,
        "status": RunStatus.SUCCEEDED,
        "error_code": None,
    }
    values.update(more)
    return EndFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "status", "code", "reason"),
    [
        ({"delete_requested": True, "ttl_passed": True}, "cancelled", "cancelled", "deleted"),
        ({"ttl_passed": True, "idle_passed": True}, "timed_out", "ttl_expired", "ttl"),
        ({"idle_passed": True}, "timed_out", "idle_timeout", "idle"),
        (
            {"status": RunStatus.FAILED, "error_code": "oom_killed", "exit_code": 137},
            "failed",
            "oom_killed",
            "container_exited",
        ),
        (
            {"status": RunStatus.FAILED, "error_code": "image_not_found", "exit_code": None},
            "failed",
            "image_not_found",
            "error",
        ),
        ({"exit_code": 143}, "failed", "sandbox_exited", "container_exited"),
        (
            {"status": RunStatus.FAILED, "error_code": "tool_failed", "exit_code": 1},
            "failed",
            "sandbox_exited",
            "container_exited",
        ),
    ],
)
def test_end_of__names_why_the_sandbox_ended(
    given: dict[str, object], status: str, code: str, reason: str
):
    end = end_of(facts(**given))

    assert (end.status.value, end.error_code) == (status, code)
    assert reason_of(end.status, end.error_code) == EndReason(reason)


def test_reason_of__none_while_it_lives_and_container_lost_from_the_reaper():
    assert reason_of(RunStatus.RUNNING, None) is None
    assert reason_of(RunStatus.QUEUED, None) is None
    assert reason_of(RunStatus.FAILED, "container_lost") is EndReason.CONTAINER_LOST


@pytest.mark.parametrize(
    ("quiet_seconds", "running", "idle"),
    [(9, 0, False), (10, 0, True), (60, 1, False)],
)
def test_idle_passed__after_the_timeout_with_no_command_running(
    quiet_seconds: int, running: int, idle: bool
):
    now = T0 + timedelta(seconds=quiet_seconds)
    assert idle_passed(now, T0, 10, running) is idle


def test_exec_timed_out__only_a_started_command_past_its_timeout():
    assert exec_timed_out(T0 + timedelta(seconds=5), T0, 5)
    assert not exec_timed_out(T0 + timedelta(seconds=4), T0, 5)
    assert not exec_timed_out(T0 + timedelta(days=1), None, 5)


@pytest.mark.parametrize(
    ("pending", "running", "limit", "start"),
    [(3, 0, 2, 2), (3, 2, 2, 0), (1, 0, 4, 1), (0, 0, 4, 0), (5, 5, 4, 0)],
)
def test_startable__keeps_running_commands_within_the_limit(
    pending: int, running: int, limit: int, start: int
):
    assert startable(pending, running, limit) == start


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        (["ls"], None),
        ([], "command must name a program"),
        (["a\x00b"], "command must not contain NUL characters"),
        (["x"] * 257, "command has more than 256 arguments"),
        (["x" * 70_000], "command is longer than 65536 bytes"),
    ],
)
def test_command_problem__refuses_what_cannot_be_run(command: list[str], problem: str | None):
    assert command_problem(command) == problem


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"LANG": "C"}, False),
        ({"1BAD": "x"}, True),
        ({"RUNYARD_RUN_ID": "x"}, True),
        ({"A": "\x00"}, True),
        ({f"V{i}": "x" for i in range(65)}, True),
    ],
)
def test_env_problem__refuses_bad_names_platform_names_and_too_much(
    env: dict[str, str], refused: bool
):
    assert (env_problem(env) is not None) is refused


@pytest.mark.parametrize(
    ("cwd", "resolved"),
    [
        (None, WORKSPACE),
        (".", WORKSPACE),
        ("src/app", f"{WORKSPACE}/src/app"),
        ("src/../lib", f"{WORKSPACE}/lib"),
        ("..", None),
        ("../../etc", None),
        ("/etc", None),
        ("a/../../x", None),
    ],
)
def test_workspace_dir__stays_inside_the_workspace(cwd: str | None, resolved: str | None):
    assert workspace_dir(cwd) == resolved


@pytest.mark.parametrize(
    ("data", "whole"),
    [
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"ab" + "€".encode()[:2], 2),
        (b"ab" + "😀".encode()[:3], 2),
        (b"ab" + "😀".encode(), 6),
        (b"", 0),
    ],
)
def test_complete_utf8__never_splits_a_character(data: bytes, whole: int):
    assert complete_utf8(data) == whole


def test_event_ids__round_trip_and_refuse_foreign_ones():
    assert parse_event_id(event_id(12, 3)) == (12, 3)
    assert parse_event_id(None) == (0, 0)
    assert parse_event_id("17") is None
    assert parse_event_id("a-b") is None


@pytest.mark.parametrize(
    ("answer", "files"),
    [
        ("missing\n", ExecFiles(started=False)),
        ("- 10 0\n", ExecFiles(True, None, 10, 0)),
        ("137 5 7\n", ExecFiles(True, 137, 5, 7)),
        ("garbage\n", ExecFiles(started=True)),
        ("0 x 1\n", ExecFiles(started=True)),
    ],
)
def test_parse_poll__reads_the_wrappers_files_and_distrusts_odd_answers(
    answer: str, files: ExecFiles
):
    assert parse_poll(answer) == files
