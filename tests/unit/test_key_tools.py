"""Which tools a key may run, and which tool lists a key may be given."""

from __future__ import annotations

import pytest

from runyard.tenancy.auth import MAX_KEY_TOOLS, Principal, may_run, tools_problem


@pytest.mark.parametrize(
    ("tools", "tool", "allowed"),
    [
        (None, "echo", True),
        (frozenset({"echo"}), "echo", True),
        (frozenset({"echo"}), "sleep", False),
        (frozenset({"echo"}), "Echo", False),
        (frozenset({"echo", "sleep"}), "sleep", True),
    ],
    ids=["every-tool", "listed", "not-listed", "names-are-exact", "one-of-several"],
)
def test_may_run__only_the_listed_tools_unless_none_are(
    tools: frozenset[str] | None, tool: str, allowed: bool
):
    assert may_run(Principal("acme", tools=tools), tool) is allowed


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        (None, None),
        (["echo"], None),
        ([], "at least one"),
        (["x" * 129], "1 to 128"),
        ([""], "1 to 128"),
        (["t"] * (MAX_KEY_TOOLS + 1), f"at most {MAX_KEY_TOOLS}"),
    ],
    ids=["every-tool", "one", "empty", "too-long", "empty-name", "too-many"],
)
def test_tools_problem__says_why_a_list_is_refused(tools: list[str] | None, says: str | None):
    problem = tools_problem(tools)
    assert problem is None if says is None else (problem is not None and says in problem)
