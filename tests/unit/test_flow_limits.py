"""The pure rules of flow control: scopes, rooms, buckets, the greedy choice, submit verdicts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runyard.domain.flow_limits import (
    FlowConfig,
    Limit,
    SubmitVerdict,
    ToolFlow,
    choose,
    rate_limit_headers,
    refilled,
    room,
    scopes_of,
    submit_verdict,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CONFIG = FlowConfig(
    tools={
        "echo": ToolFlow(tool=Limit(max_running=10), key=Limit(max_running=2)),
        "keyed": ToolFlow(key=Limit(per_second=1.0)),
    },
    tenant=Limit(),
)


@pytest.mark.parametrize(
    ("tool", "key", "tenant_limit", "expected"),
    [
        ("echo", None, Limit(), ("tool:echo",)),
        ("echo", "c1", Limit(), ("key:echo:acme:c1", "tool:echo")),
        ("keyed", None, Limit(), None),
        ("keyed", "c1", Limit(), ("key:keyed:acme:c1",)),
        ("other", "c1", Limit(), None),
        ("other", None, Limit(max_running=5), ("tenant:acme",)),
    ],
)
def test_scopes_of__only_the_limited_ones(tool, key, tenant_limit, expected):
    config = FlowConfig(tools=CONFIG.tools, tenant=tenant_limit)
    assert scopes_of(config, "acme", tool, key) == expected


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("tool:echo", Limit(max_running=10)),
        ("key:echo:acme:c:1", Limit(max_running=2)),
        ("key:keyed:acme:x", Limit(per_second=1.0)),
        ("tool:gone", Limit()),
        ("tenant:acme", Limit()),
    ],
)
def test_limit_of__reads_the_scope_kind_and_tool(scope, expected):
    assert CONFIG.limit_of(scope) == expected


@pytest.mark.parametrize(
    ("limit", "tokens", "refilled_at", "now", "expected"),
    [
        (Limit(), 0.0, T0, T0, None),
        (Limit(per_second=5), None, None, T0, 5.0),
        (Limit(per_second=5), 0.0, T0, T0 + timedelta(seconds=0.5), 2.5),
        (Limit(per_second=5), 4.0, T0, T0 + timedelta(seconds=10), 5.0),
        (Limit(per_second=0.5), 0.0, T0, T0 + timedelta(seconds=1), 0.5),
        (Limit(per_second=0.5), None, None, T0, 1.0),  # at least one token
        (Limit(per_second=5), 1.0, T0, T0 - timedelta(seconds=1), 1.0),  # a clock behind
    ],
)
def test_refilled__a_bucket_of_one_seconds_worth(limit, tokens, refilled_at, now, expected):
    assert refilled(limit, tokens, refilled_at, now) == expected


@pytest.mark.parametrize(
    ("limit", "in_flight", "tokens", "expected"),
    [
        (Limit(), 7, None, None),
        (Limit(max_running=2), 1, None, 1),
        (Limit(max_running=2), 3, None, 0),
        (Limit(per_second=5), 0, 2.9, 2),
        (Limit(max_running=4, per_second=5), 3, 2.9, 1),
        (Limit(per_second=5), 0, 0.999, 0),
        (Limit(per_second=5), 0, 0.99999999999, 1),  # float error is no missing token
    ],
)
def test_room__the_smaller_of_what_is_left_and_whole_tokens(limit, in_flight, tokens, expected):
    assert room(limit, in_flight, tokens) == expected


def test_choose__greedy_in_order_and_a_held_run_takes_nothing_from_others():
    candidates = [
        ("a1", ["tenant:a", "tool:t"]),
        ("a2", ["tenant:a", "tool:t"]),
        ("b1", ["tenant:b", "tool:t"]),
        ("b2", ["tenant:b", "tool:t"]),
        ("c1", ["tenant:c"]),
    ]
    rooms = {"tenant:a": 1, "tenant:b": None, "tool:t": 2, "tenant:c": 0}
    assert choose(candidates, rooms) == ["a1", "b1"]
    assert choose(candidates, {"tenant:a": None, "tool:t": None, "tenant:b": 0}) == [
        "a1",
        "a2",
    ]
    assert choose([("x", ["unknown"])], {}) == []  # a scope this pass did not lock


@pytest.mark.parametrize(
    ("tokens_after", "expected"),
    [
        (None, SubmitVerdict(True, 0, 0)),
        (1.5, SubmitVerdict(True, 1, 0)),
        (0.0, SubmitVerdict(True, 0, 0)),
        (-0.5, SubmitVerdict(False, 0, 1)),
        (-0.9, SubmitVerdict(False, 0, 1)),
    ],
)
def test_submit_verdict__from_the_bucket_after_the_take(tokens_after, expected):
    assert submit_verdict(Limit(per_second=2), tokens_after) == expected


def test_submit_verdict__a_slow_rate_waits_longer():
    assert submit_verdict(Limit(per_second=0.1), -1.0).retry_after_seconds == 10


def test_rate_limit_headers__policy_remaining_and_retry_after():
    refused = rate_limit_headers(Limit(per_second=5), SubmitVerdict(False, 0, 1))
    assert refused == {
        "RateLimit-Policy": '"submits";q=5;w=1',
        "RateLimit": '"submits";r=0;t=1',
        "Retry-After": "1",
    }
    allowed = rate_limit_headers(Limit(per_second=5), SubmitVerdict(True, 3, 0))
    assert "Retry-After" not in allowed and allowed["RateLimit"] == '"submits";r=3;t=1'
