"""The scheduler against Postgres: each slot makes one run, whatever passes run at once or die
half-way; missed slots follow catch_up; pause and resume; slots that cannot make a run."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from runyard.domain.schedule_slots import CatchUp
from runyard.queue import AdmissionCaps
from runyard.registry.tools import ToolRegistry
from runyard.schedules.scheduler import Scheduler, SchedulerConfig, SchedulerResult
from runyard.schedules.store import NewSchedule, Schedules, ScheduleView

T0 = datetime(2030, 1, 1, tzinfo=UTC)
CONFIG = SchedulerConfig(grace_seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def create(
    engine: Engine,
    registry: ToolRegistry,
    *,
    catch_up: CatchUp = CatchUp.ALL,
    tool: str = "echo",
    tenant: str = "acme",
    **fields: Any,
) -> ScheduleView:
    new = NewSchedule(
        tenant, tool, {"n": 1}, None, fields.pop("every_seconds", 10), catch_up=catch_up, **fields
    )
    return Schedules(engine, registry, max_per_tenant=0).create(
        dataclasses.replace(new, start_at=new.start_at or T0), now=T0
    )


def slots_of(engine: Engine, schedule_id: Any) -> list[datetime]:
    """The slots of the schedule's runs, each once per run, in order."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT schedule_slot FROM tool_runs WHERE schedule_id = :id ORDER BY schedule_slot"
            ),
            {"id": schedule_id},
        )
        return [row.schedule_slot for row in rows]


@pytest.fixture
def scheduler(engine: Engine, registry: ToolRegistry) -> Scheduler:
    return Scheduler(engine, registry, AdmissionCaps(), CONFIG)


def test_scheduler__fires_each_due_slot_once_and_moves_the_cursor(engine, registry, scheduler):
    made = create(engine, registry)
    assert made.next_slot_at == T0
    assert scheduler.run_once(now=at(25)) == SchedulerResult(schedules=1, fired=3)
    assert scheduler.run_once(now=at(25)) == SchedulerResult()
    assert scheduler.run_once(now=at(30)) == SchedulerResult(schedules=1, fired=1)
    assert slots_of(engine, made.id) == [at(0), at(10), at(20), at(30)]
    view = Schedules(engine, registry, max_per_tenant=0).get(made.id, "acme")
    assert view is not None
    assert (view.next_slot_at, view.fired, view.last_slot_at) == (at(40), 4, at(30))
    with engine.connect() as conn:
        run = conn.execute(
            text("SELECT status, tool, input FROM tool_runs WHERE id = :id"),
            {"id": view.last_run_id},
        ).one()
    assert (run.status, run.tool, run.input) == ("queued", "echo", {"n": 1})


def test_scheduler__passes_at_once_fire_each_slot_once(engine, registry):
    made = [create(engine, registry, every_seconds=1) for _ in range(3)]
    schedulers = [Scheduler(engine, registry, AdmissionCaps(), CONFIG) for _ in range(4)]
    start = threading.Barrier(len(schedulers))
    results: list[SchedulerResult] = []

    def passes(scheduler: Scheduler) -> None:
        start.wait()
        for second in range(0, 60, 3):
            results.append(scheduler.run_once(now=at(second)))

    threads = [threading.Thread(target=passes, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for schedule in made:
        assert slots_of(engine, schedule.id) == [at(n) for n in range(58)]
    assert sum(result.fired for result in results) == 3 * 58


def test_scheduler__a_slot_that_fired_cannot_make_a_second_run(engine, registry, scheduler):
    made = create(engine, registry)
    scheduler.run_once(now=at(0))
    with engine.begin() as conn:  # the cursor back at a slot that fired: the index refuses it
        conn.execute(text("UPDATE schedules SET next_slot_at = :t"), {"t": T0})
    assert scheduler.run_once(now=at(0)) == SchedulerResult(schedules=1, refused=1)
    assert slots_of(engine, made.id) == [T0]
    view = Schedules(engine, registry, max_per_tenant=0).get(made.id, "acme")
    assert view is not None and view.next_slot_at == at(10) and view.fired == 1
    assert view.last_error == "a slot of this pass had made its run already"


def test_scheduler__dying_before_the_commit_leaves_the_slots_to_the_next_pass(
    engine, registry, monkeypatch
):
    made = create(engine, registry)
    dying = Scheduler(engine, registry, AdmissionCaps(), CONFIG)

    def die(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed between the runs and the cursor")

    monkeypatch.setattr(dying, "_advance", die)
    with pytest.raises(RuntimeError):
        dying.run_once(now=at(15))
    assert slots_of(engine, made.id) == []
    assert Scheduler(engine, registry, AdmissionCaps(), CONFIG).run_once(now=at(15)).fired == 2
    assert slots_of(engine, made.id) == [at(0), at(10)]


def test_scheduler__catch_up_none_skips_what_it_missed_and_one_fires_the_latest(
    engine, registry, scheduler
):
    none = create(engine, registry, catch_up=CatchUp.NONE)
    one = create(engine, registry, catch_up=CatchUp.ONE)
    scheduler.run_once(now=at(100))  # grace 30 s: 70 to 100 are on time
    assert slots_of(engine, none.id) == [at(70), at(80), at(90), at(100)]
    assert slots_of(engine, one.id) == [at(60), at(70), at(80), at(90), at(100)]
    view = Schedules(engine, registry, max_per_tenant=0).get(none.id, "acme")
    assert view is not None and view.skipped == 7


def test_scheduler__paused_fires_nothing_and_resume_skips_the_paused_slots(
    engine, registry, scheduler
):
    store = Schedules(engine, registry, max_per_tenant=0)
    made = create(engine, registry)
    assert store.pause(made.id, "acme") is not None
    assert scheduler.run_once(now=at(50)) == SchedulerResult()
    resumed = store.resume(made.id, "acme", now=at(55))
    assert resumed is not None and not resumed.paused and resumed.next_slot_at == at(60)
    scheduler.run_once(now=at(60))
    assert slots_of(engine, made.id) == [at(60)]


def test_scheduler__a_tool_gone_spends_the_slot_and_says_why(engine, registry, scheduler):
    made = create(engine, registry)
    gone = dataclasses.replace(registry, tools={})
    result = Scheduler(engine, gone, AdmissionCaps(), CONFIG).run_once(now=at(10))
    assert result == SchedulerResult(schedules=1, refused=2)
    view = Schedules(engine, registry, max_per_tenant=0).get(made.id, "acme")
    assert view is not None and view.next_slot_at == at(20) and view.fired == 0
    assert view.last_error is not None and "echo" in view.last_error
    assert scheduler.run_once(now=at(20)).fired == 1
    assert slots_of(engine, made.id) == [at(20)]


def test_scheduler__a_tenant_cap_spends_the_slot_and_says_why(engine, registry):
    made = create(engine, registry)
    scheduler = Scheduler(engine, registry, AdmissionCaps(tenant_max_queued=1), CONFIG)
    scheduler.run_once(now=at(0))
    scheduler.run_once(now=at(10))  # one run queued already: the second slot is refused
    assert slots_of(engine, made.id) == [at(0)]
    view = Schedules(engine, registry, max_per_tenant=0).get(made.id, "acme")
    assert view is not None and view.skipped == 1 and view.next_slot_at == at(20)
    assert view.last_error is not None and "queued" in view.last_error


def test_scheduler__end_at_finishes_the_schedule(engine, registry, scheduler):
    made = create(engine, registry, end_at=at(15))
    scheduler.run_once(now=at(100))
    view = Schedules(engine, registry, max_per_tenant=0).get(made.id, "acme")
    assert view is not None and view.next_slot_at is None
    assert slots_of(engine, made.id) == [at(0), at(10)]
    assert scheduler.run_once(now=at(200)) == SchedulerResult()
