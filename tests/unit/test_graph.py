"""The workflow graph rules: refs, cycles, order, and how each new run starts."""

from __future__ import annotations

import uuid

import pytest

from runyard.domain.graph import (
    Dependency,
    GraphProblem,
    Node,
    Start,
    describe_end,
    resolve,
    starts,
)

DONE, RUNNING, FAILED = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
EXISTING = {
    DONE: Dependency("succeeded"),
    RUNNING: Dependency("running"),
    FAILED: Dependency("failed", "tool_failed", "build"),
}


def nodes(*spec: tuple[str, tuple[str, ...]]) -> list[Node]:
    return [Node(ref, deps) for ref, deps in spec]


@pytest.mark.parametrize(
    ("graph", "problem", "index"),
    [
        (nodes(("a", ("b",)), ("b", ("a",))), "cycle through 'a'", 0),
        (nodes(("a", ()), ("b", ("c",)), ("c", ("d",)), ("d", ("b",))), "cycle", 1),
        (nodes(("a", ()), ("a", ())), "ref 'a' is used twice", 1),
        (nodes(("a", ("a",))), "depends on itself", 0),
        (nodes(("a", ("zzz",))), "neither a ref of this batch nor a run id", 0),
        ([Node("a", tuple(str(uuid.UUID(int=i)) for i in range(101)))], "at most 100", 0),
    ],
)
def test_resolve__refuses_bad_graphs_naming_the_item(graph, problem, index):
    with pytest.raises(GraphProblem, match=problem) as refused:
        resolve(graph)
    assert refused.value.index == index


def test_resolve__orders_dependencies_first_and_splits_internal_from_existing():
    graph = nodes(("c", ("b", str(DONE))), ("b", ("a",)), ("a", ()), ("d", ("a", "a")))
    resolved = resolve(graph)
    position = {graph[i].ref: n for n, i in enumerate(resolved.order)}
    assert position["a"] < position["b"] < position["c"]
    assert position["a"] < position["d"]
    assert resolved.internal == ((1,), (2,), (), (2,))  # duplicates count once
    assert resolved.external == ((DONE,), (), (), ())
    assert resolved.existing() == [DONE]


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        # Existing runs: a success is not waited for, an active run is, a failure dooms.
        (nodes(("x", (str(DONE),))), [Start(0)]),
        (nodes(("x", (str(DONE), str(RUNNING)))), [Start(1)]),
        (
            nodes(("x", (str(RUNNING), str(FAILED)))),
            [Start(0, f"dependency {FAILED} (ref build) ended failed (tool_failed)")],
        ),
        # Batch runs wait for each other; a doomed run dooms its dependents, naming itself.
        (nodes(("a", ()), ("b", ("a",)), ("c", ("a", "b"))), [Start(0), Start(1), Start(2)]),
        (
            nodes(("a", (str(FAILED),)), ("b", ("a",))),
            [
                Start(0, f"dependency {FAILED} (ref build) ended failed (tool_failed)"),
                Start(
                    0, f"dependency {uuid.UUID(int=100)} (ref a) ended failed (dependency_failed)"
                ),
            ],
        ),
    ],
)
def test_starts__waits_or_dooms(graph, expected):
    run_ids = [uuid.UUID(int=100 + i) for i in range(len(graph))]
    assert starts(resolve(graph), graph, run_ids, EXISTING) == expected


def test_describe_end__names_ref_and_code_only_when_they_add_something():
    assert describe_end(DONE, Dependency("cancelled", "cancelled")) == (
        f"dependency {DONE} ended cancelled"
    )
    assert describe_end(DONE, Dependency("timed_out", "idle_timeout", "t")) == (
        f"dependency {DONE} (ref t) ended timed_out (idle_timeout)"
    )
