"""Flow control over the queue: the gate that releases held jobs within their scopes' limits,
and the tenants' submit buckets. The rules are ``runyard.domain.flow_limits``; the
statements ``runyard.queue.flow_sql``."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from runyard.domain.flow_limits import (
    FlowConfig,
    Limit,
    SubmitVerdict,
    choose,
    refilled,
    room,
    submit_verdict,
)
from runyard.platform.db import autocommit
from runyard.queue.flow_sql import (
    ANY_HELD,
    CANDIDATES,
    HELD_SCOPES,
    LOCK_SCOPES,
    NEW_BUCKET,
    RELEASE,
    TAKE_TOKEN,
)

# Held jobs one gate pass looks at, in claim order, and how often a worker passes the gate.
GATE_BATCH = 200
GATE_INTERVAL_SECONDS = 0.1
# With no job held anywhere, a worker's gate passes this seldom unless a held job's
# notification wakes it: the fallback for a notification missed (or no LISTEN at all).
GATE_REST_SECONDS = 1.0
# The same while the worker's LISTEN link is up: every held job is written with its
# notification, so none is missed; a link lost or back wakes the gate (``hears_held``).
GATE_HEARD_REST_SECONDS = 10.0


class FlowGate:
    """Releases held jobs to the claim as their scopes have room; any number may run."""

    def __init__(
        self,
        engine: Engine,
        config: Callable[[], FlowConfig],
        *,
        batch: int = GATE_BATCH,
        interval_seconds: float = 0.0,
        rest_seconds: float = 0.0,
        heard_rest_seconds: float = 0.0,
    ) -> None:
        self._engine = engine
        # Read at each pass: the limits follow the registry's reloads.
        self._config = config
        self._batch = batch
        # A process's claims pass the gate at most this often: a busy worker's claims do not
        # each pay for a pass (the gates of other processes go on meanwhile).
        self._interval = interval_seconds
        self._next_pass = 0.0
        # With ``rest_seconds``, a pass that finds no job held anywhere lets the gate rest:
        # later passes are skipped (no statement) until ``wake`` or that long after.
        self._rest = rest_seconds
        # ... or that long while this process hears every held job's notification.
        self._heard_rest = max(heard_rest_seconds, rest_seconds)
        self._hearing = False
        self._rest_until = 0.0
        # Jobs held behind full scopes were seen: ``ANY_HELD`` is not asked again before this.
        self._held_seen_until = 0.0
        # The gate rests because it found no job held at all: when the rest runs out with no
        # wake-up, one ``ANY_HELD`` probe says whether to pass or rest again.
        self._resting = False
        self._woken = threading.Event()

    def wake(self) -> None:
        """A held job was written: the next pass looks, resting or not (any thread)."""
        self._woken.set()

    def hears_held(self, hearing: bool) -> None:
        """This process's LISTEN link for held jobs is up (True) or lost (any thread): while
        it is up, a rest may last the longer period. Either way the next pass looks, for a
        job held while the link was down."""
        self._hearing = hearing
        self._woken.set()

    def quiet_for(self) -> float:
        """Seconds the gate rests for yet (its passes make no statement until then); 0 once
        woken, or when it does not rest."""
        if self._rest <= 0 or self._woken.is_set():
            return 0.0
        return max(0.0, self._rest_until - time.monotonic())

    def follow(self, config: Callable[[], FlowConfig]) -> None:
        """Read the limits from ``config`` from now on (a process's reloaded registry)."""
        self._config = config

    def release(self, *, now: datetime | None = None) -> int:
        """One pass, unless this process made one less than the interval ago or the gate
        rests: how many held jobs it released (0 when none waits, in one statement; two
        when it then finds none held at all and starts resting; one, ``ANY_HELD``, when a
        rest ran out with no job held since)."""
        if self._interval > 0:
            moment = time.monotonic()
            if moment < self._next_pass:
                return 0
            self._next_pass = moment + self._interval
        if self._rest > 0:
            if self.quiet_for() > 0:
                return 0
            # Cleared before the reads: a job held after them notifies after its commit.
            woken = self._woken.is_set()
            self._woken.clear()
            if self._resting and not woken and not self._any_held():
                self._start_rest()
                return 0
            # Woken, or a job is held: passes go on until one finds none held at all (what
            # is left of an earlier rest would skip the passes a held job needs).
            self._resting = False
            self._rest_until = 0.0
        params = {"n": self._batch, "now": now}
        scopes = [row.scope for row in autocommit(self._engine, HELD_SCOPES, params)]
        if not scopes:
            self._maybe_rest()
            return 0
        config = self._config()
        with self._engine.begin() as conn:
            locked = conn.execute(LOCK_SCOPES, {"scopes": scopes, "now": now}).all()
            if not locked:
                return 0  # other gates hold them: they release those jobs
            names = [row.scope for row in locked]
            limits = {row.scope: config.limit_of(row.scope) for row in locked}
            tokens = {
                row.scope: refilled(limits[row.scope], row.tokens, row.refilled_at, row.now)
                for row in locked
            }
            rooms = {
                row.scope: room(limits[row.scope], row.in_flight, tokens[row.scope])
                for row in locked
            }
            candidates = conn.execute(CANDIDATES, {**params, "scopes": names}).all()
            chosen = choose([(row.id, row.flow_scopes) for row in candidates], rooms)
            picked = set(chosen)
            used = Counter(s for row in candidates if row.id in picked for s in row.flow_scopes)
            counters = {
                scope: {
                    "add": used[scope],
                    "tokens": _spend(tokens[scope], used[scope]),
                    "max": limits[scope].max_running,
                    "rate": limits[scope].per_second,
                }
                for scope in names
            }
            found = conn.execute(
                RELEASE, {"ids": chosen, "counters": json.dumps(counters), "now": now}
            ).one()
        return int(found.released)

    def _maybe_rest(self) -> None:
        """After a pass that found no scope with room: rest if no job is held at all (asked
        at most once a rest period while jobs wait behind full scopes)."""
        if self._rest <= 0 or time.monotonic() < self._held_seen_until:
            return
        if not self._any_held():
            self._start_rest()

    def _start_rest(self) -> None:
        """No job is held at all: skip passes for a rest period (or until woken)."""
        self._rest_until = time.monotonic() + (self._heard_rest if self._hearing else self._rest)
        self._resting = True

    def _any_held(self) -> bool:
        """Whether any job is held at all; when one is, not asked again for a rest period."""
        if autocommit(self._engine, ANY_HELD, {})[0].held:
            self._held_seen_until = time.monotonic() + self._rest
            return True
        return False


def _spend(tokens: float | None, used: int) -> float | None:
    """A bucket after ``used`` releases (None: no rate)."""
    return None if tokens is None else tokens - used


class SubmitRates:
    """Each tenant's submit bucket (``RUNYARD_TENANT_SUBMITS_PER_SECOND``)."""

    def __init__(self, engine: Engine, limit: Limit) -> None:
        self._engine = engine
        self.limit = limit

    def take(self, tenant: str, *, now: datetime | None = None) -> SubmitVerdict:
        """Take one token of the tenant's bucket, if there is one."""
        if self.limit.per_second is None:
            return submit_verdict(self.limit, None)
        params: dict[str, Any] = {
            "scope": f"submit:{tenant}",
            "burst": self.limit.burst,
            "rate": self.limit.per_second,
            "now": now,
        }
        for statement in (TAKE_TOKEN, NEW_BUCKET, TAKE_TOKEN):  # a new bucket may race
            rows = autocommit(self._engine, statement, params)
            if rows:
                return submit_verdict(self.limit, float(rows[0].tokens_after))
        raise AssertionError("a bucket that is neither there nor new")
