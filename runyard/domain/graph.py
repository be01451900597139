"""Rules of a workflow graph: resolving ``depends_on``, refusing cycles, and which runs are
doomed or waiting when they are submitted. Pure functions; the queue writes what they say.

A run may depend only on runs that exist when it is submitted, or on runs earlier in the
same batch's order of dependencies: every edge points to a run that was complete in the
graph before its dependent joined it, so no cycle can ever form (a batch whose refs form one
is refused as a whole).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_DEPENDENCIES = 100
MAX_BATCH_RUNS = 1000
SUCCEEDED = "succeeded"
ACTIVE = ("queued", "running")


class GraphProblem(Exception):
    """A batch item (``index``; None for a single run) cannot be admitted, and why."""

    def __init__(self, message: str, index: int | None = None, field: str = "depends_on") -> None:
        super().__init__(message)
        self.index = index
        self.field = field


@dataclass(frozen=True)
class Node:
    """One run of a graph as submitted: its ref (batches) and what it depends on, each a ref
    of the same batch or the id of an existing run."""

    ref: str | None
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolved:
    """A graph in an order where every run comes after the runs of the batch it depends on."""

    order: tuple[int, ...]
    internal: tuple[tuple[int, ...], ...]  # per node, indexes of the batch runs it waits for
    external: tuple[tuple[uuid.UUID, ...], ...]  # per node, existing runs it waits for

    def existing(self) -> list[uuid.UUID]:
        """Every existing run some node depends on, once, in id order (the lock order)."""
        return sorted({dep for deps in self.external for dep in deps})


def _as_run_id(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def resolve(nodes: Sequence[Node]) -> Resolved:
    """Check refs and dependencies and order the graph (Kahn); raises ``GraphProblem``."""
    index_of: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.ref is not None:
            if node.ref in index_of:
                raise GraphProblem(f"ref {node.ref!r} is used twice", i, "ref")
            index_of[node.ref] = i
    internal: list[tuple[int, ...]] = []
    external: list[tuple[uuid.UUID, ...]] = []
    for i, node in enumerate(nodes):
        if len(node.depends_on) > MAX_DEPENDENCIES:
            raise GraphProblem(f"at most {MAX_DEPENDENCIES} dependencies per run", i)
        inside: dict[int, None] = {}
        outside: dict[uuid.UUID, None] = {}
        for name in node.depends_on:
            if name in index_of:
                if index_of[name] == i:
                    raise GraphProblem(f"run {name!r} depends on itself", i)
                inside[index_of[name]] = None
                continue
            run_id = _as_run_id(name)
            if run_id is None:
                raise GraphProblem(
                    f"depends_on names {name!r}, neither a ref of this batch nor a run id", i
                )
            outside[run_id] = None
        internal.append(tuple(inside))
        external.append(tuple(outside))
    return Resolved(
        order=_ordered(nodes, internal), internal=tuple(internal), external=tuple(external)
    )


def _ordered(nodes: Sequence[Node], internal: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Dependencies first; a cycle is refused naming one of its runs."""
    waiting = [len(deps) for deps in internal]
    dependents: list[list[int]] = [[] for _ in nodes]
    for i, deps in enumerate(internal):
        for dep in deps:
            dependents[dep].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for dependent in dependents[i]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    if len(order) < len(nodes):
        stuck = min(i for i, count in enumerate(waiting) if count > 0)
        name = nodes[stuck].ref or f"item {stuck}"
        raise GraphProblem(f"the dependencies form a cycle through {name!r}", stuck)
    return tuple(order)


@dataclass(frozen=True)
class Dependency:
    """How an existing run a new one depends on stands when the new one is written."""

    status: str
    error_code: str | None = None
    ref: str | None = None


@dataclass(frozen=True)
class Start:
    """How a new run starts: waiting for ``waiting_on`` dependencies, or failed at once
    because one of them already ended without success (``error``)."""

    waiting_on: int
    error: str | None = None


def describe_end(run_id: uuid.UUID, dependency: Dependency) -> str:
    """The ``error`` of a run whose dependency ended without success."""
    named = f" (ref {dependency.ref})" if dependency.ref else ""
    code = dependency.error_code
    how = f" ({code})" if code and code != dependency.status else ""
    return f"dependency {run_id}{named} ended {dependency.status}{how}"


def starts(
    resolved: Resolved,
    nodes: Sequence[Node],
    run_ids: Sequence[uuid.UUID],
    existing: Mapping[uuid.UUID, Dependency],
) -> list[Start]:
    """Each node's start, given the existing runs it depends on (all must be in
    ``existing``); a node whose dependency is doomed is doomed too, naming that one."""
    result: list[Start | None] = [None] * len(nodes)
    for i in resolved.order:
        error = None
        waiting = 0
        for run_id in resolved.external[i]:
            dependency = existing[run_id]
            if dependency.status in ACTIVE:
                waiting += 1
            elif dependency.status != SUCCEEDED and error is None:
                error = describe_end(run_id, dependency)
        for dep in resolved.internal[i]:
            before = result[dep]
            assert before is not None  # the order puts dependencies first
            if before.error is not None and error is None:
                error = describe_end(
                    run_ids[dep], Dependency("failed", "dependency_failed", nodes[dep].ref)
                )
            waiting += 1
        result[i] = Start(waiting_on=0 if error else waiting, error=error)
    return [start for start in result if start is not None]


def batch_status(runs: Sequence[tuple[str, str | None]]) -> str:
    """A batch's status from its runs' ``(status, error_code)``: ``queued`` while all are,
    ``running`` while any is active, then ``succeeded`` if all did, ``cancelled`` if the
    failures are cancels (and runs failed by them), else ``failed``."""
    statuses = [status for status, _ in runs]
    if statuses and all(status == "queued" for status in statuses):
        return "queued"
    if any(status in ACTIVE for status in statuses):
        return "running"
    if all(status == "succeeded" for status in statuses):
        return "succeeded"
    own_failures = [
        status
        for status, code in runs
        if status not in ("succeeded", "cancelled") and code != "dependency_failed"
    ]
    if not own_failures and "cancelled" in statuses:
        return "cancelled"
    return "failed"


def summarized(rows: Sequence[Any]) -> tuple[str, dict[str, int]]:
    """A batch's status and its latest runs counted by status, from its rows of
    ``(status, dependency_failed, runs)``: one per status (and whether a dependency failed)."""
    counts: dict[str, int] = {}
    pairs: list[tuple[str, str | None]] = []
    for row in rows:
        if row.status is None:  # a batch whose runs are gone
            continue
        counts[row.status] = counts.get(row.status, 0) + int(row.runs)
        pairs.append((row.status, "dependency_failed" if row.dependency_failed else None))
    return batch_status(pairs), counts
