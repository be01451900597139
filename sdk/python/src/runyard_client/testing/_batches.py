"""Batches in the fake: a graph of runs admitted whole, read by ref, cancelled, retried."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from runyard_client.testing._backend import ACTIVE, FakeBackend, FakeBatch, FakeProblem, FakeRun


def status_of(runs: list[FakeRun]) -> str:
    """The batch's status from its latest runs (as the API tells it)."""
    statuses = [run.status for run in runs]
    if statuses and all(status == "queued" for status in statuses):
        return "queued"
    if any(status in ACTIVE for status in statuses):
        return "running"
    if all(status == "succeeded" for status in statuses):
        return "succeeded"
    own = [
        run
        for run in runs
        if run.status not in ("succeeded", "cancelled") and run.error_code != "dependency_failed"
    ]
    return "cancelled" if not own and "cancelled" in statuses else "failed"


def _order(items: list[dict[str, Any]], refs: list[str]) -> list[int]:
    """The items in an order where each comes after the refs it names; 422 on a cycle."""
    index = {ref: i for i, ref in enumerate(refs)}
    done: list[int] = []
    state: dict[int, str] = {}

    def visit(i: int) -> None:
        if state.get(i) == "done":
            return
        if state.get(i) == "open":
            raise FakeProblem(
                422, "invalid_graph", f"runs[{i}]: the batch has a cycle", field=f"runs[{i}]"
            )
        state[i] = "open"
        for name in items[i].get("depends_on", ()):
            if name in index:
                visit(index[name])
        state[i] = "done"
        done.append(i)

    for i in range(len(items)):
        visit(i)
    return done


def _dependency(backend: FakeBackend, name: str, made: dict[str, uuid.UUID], i: int) -> uuid.UUID:
    if name in made:
        return made[name]
    try:
        run_id = uuid.UUID(name)
    except ValueError:
        run_id = None
    if run_id is None or run_id not in backend.runs:
        detail = f"runs[{i}]: depends_on names neither a ref of the batch nor a run: {name}"
        raise FakeProblem(422, "unknown_dependency", detail, field=f"runs[{i}].depends_on")
    return run_id


def submit(backend: FakeBackend, items: list[dict[str, Any]], callback: str | None) -> FakeBatch:
    """Admit every run or none; the batch."""
    refs = [item.get("ref") or f"#{i}" for i, item in enumerate(items)]
    repeated = [ref for ref, n in Counter(refs).items() if n > 1]
    if repeated:
        raise FakeProblem(422, "invalid_graph", f"ref {repeated[0]!r} repeats", field="runs")
    batch = FakeBatch(uuid.uuid4(), backend.clock(), len(items), {})
    before = dict(backend.runs)
    try:
        made: dict[str, uuid.UUID] = {}
        for i in _order(items, refs):
            item = items[i]
            deps = tuple(_dependency(backend, name, made, i) for name in item.get("depends_on", ()))
            request = {**item, "callback_url": item.get("callback_url") or callback}
            try:
                run = backend.create(request, depends_on=deps, batch_id=batch.id, ref=refs[i])
            except FakeProblem as exc:
                field = f"runs[{i}].{exc.extra['field']}" if "field" in exc.extra else "runs"
                exc.extra["field"] = field
                exc.detail = f"runs[{i}]: {exc.detail}"
                raise
            made[refs[i]] = run.id
    except FakeProblem:
        backend.runs = before  # all or nothing
        raise
    batch.refs = {ref: made[ref] for ref in refs}
    backend.batches[batch.id] = batch
    return batch


def find(backend: FakeBackend, batch_id: uuid.UUID) -> FakeBatch:
    """A batch, or 404."""
    batch = backend.batches.get(batch_id)
    if batch is None:
        raise FakeProblem(404, "batch_not_found", f"no batch {batch_id}")
    return batch


def _depends(backend: FakeBackend, batch: FakeBatch, run: FakeRun) -> list[str]:
    names = {run_id: ref for ref, run_id in batch.refs.items()}
    return [names.get(dep) or str(dep) for dep in run.depends_on]


def view(backend: FakeBackend, batch: FakeBatch, *, with_runs: bool = True) -> dict[str, Any]:
    """The batch as ``GET /v1/batches/{id}`` (or a page of batches) shows it."""
    latest = [backend.runs[run_id] for run_id in batch.refs.values() if run_id in backend.runs]
    body: dict[str, Any] = {
        "id": batch.id,
        "status": status_of(latest),
        "created_at": batch.created_at,
        "size": batch.size,
        "counts": dict(Counter(run.status for run in latest)),
    }
    if with_runs:
        body["runs"] = [
            {
                "ref": run.ref,
                "run_id": run.id,
                "tool": run.tool,
                "status": run.status,
                "error_code": run.error_code,
                "depends_on": _depends(backend, batch, run),
                "rerun_of": run.rerun_of,
                "requested_at": run.requested_at,
                "finished_at": run.finished_at,
            }
            for run in latest
        ]
    return body


def ended(backend: FakeBackend, batch: FakeBatch) -> bool:
    """Whether no latest run of the batch is queued or running."""
    latest = [backend.runs[run_id] for run_id in batch.refs.values() if run_id in backend.runs]
    return status_of(latest) not in ACTIVE


def cancel(backend: FakeBackend, batch: FakeBatch) -> None:
    """Cancel every queued run of the batch."""
    for run_id in batch.refs.values():
        run = backend.runs.get(run_id)
        if run is not None and run.status in ACTIVE:
            backend.cancel(run)


def retry(backend: FakeBackend, batch: FakeBatch) -> dict[str, uuid.UUID]:
    """New runs for every ref whose latest run did not succeed; the new runs by ref."""
    latest = {ref: backend.runs[run_id] for ref, run_id in batch.refs.items()}
    if any(run.status in ACTIVE for run in latest.values()):
        raise FakeProblem(409, "batch_not_finished", "the batch still has runs queued or running")
    again = [ref for ref, run in latest.items() if run.status != "succeeded"]
    made: dict[str, uuid.UUID] = {}
    old_refs = {run_id: ref for ref, run_id in batch.refs.items()}
    items = []
    for ref in again:
        old = latest[ref]
        names = [old_refs.get(dep, str(dep)) for dep in old.depends_on]
        items.append({"ref": ref, "tool": old.tool, "input": old.input, "depends_on": names})
    for i in _order(items, again):
        old = latest[again[i]]
        deps = tuple(
            made[name] if name in made else batch.refs.get(name) or uuid.UUID(name)
            for name in items[i]["depends_on"]
        )
        request = {"tool": old.tool, "input": old.input, "priority": old.priority}
        run = backend.create(
            request, depends_on=deps, batch_id=batch.id, ref=again[i], rerun_of=old.id
        )
        made[again[i]] = run.id
    batch.refs.update(made)
    return made
