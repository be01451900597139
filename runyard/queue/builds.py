"""Builds as leased jobs: one method per transition of a ``tool_builds`` row (and of the runs
that wait for it), each a named statement of ``runyard.queue.build_sql``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, TextClause

from runyard.builder import BuildRequest
from runyard.domain.build_ref import BuildRef
from runyard.platform.db import autocommit
from runyard.queue.build_sql import (
    APPEND_BUILD_LOG,
    BUILD_FAILED,
    BUILD_READY,
    BUILD_WAIT,
    BUILD_WORK,
    CLAIM_BUILD,
    FAIL_WAITING,
    HEARTBEAT_BUILD,
    REBUILD,
    RELEASE_BUILD,
    REQUEST_BUILDS,
    SAVE_CONTEXT,
)

DEFAULT_LOG_CAP = 65_536
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class ClaimedBuild:
    """A build this worker holds the lease of, with its source."""

    build_id: uuid.UUID
    lease_token: uuid.UUID
    attempt: int
    max_attempts: int
    recovered: bool
    deadline_at: datetime
    request: BuildRequest


@dataclass(frozen=True)
class BuildWait:
    """A run's wait for its image: from its submit until its build was ready on the engine
    (``traceparent``: the build's span, if it was traced)."""

    queued_at: datetime
    ready_at: datetime
    traceparent: str | None


@dataclass(frozen=True)
class Rebuilt:
    """What an admin's build request changed: rows queued again, rows made."""

    again: int
    made: int


class BuildQueue:
    """Every transition of a build, fenced by its lease token after the claim."""

    def __init__(
        self,
        engine: Engine,
        *,
        log_cap: int = DEFAULT_LOG_CAP,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self._engine = engine
        self._log_cap = log_cap
        self._max_attempts = max_attempts

    def _run(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        return autocommit(self._engine, statement, params)

    def save_context(self, ref: BuildRef, tar: bytes, *, now: datetime | None = None) -> None:
        """Keep the source of a digest (once; a second save of the tag changes nothing)."""
        self._run(
            SAVE_CONTEXT,
            {
                "tag": ref.tag,
                "tool": ref.tool,
                "digest": ref.digest,
                "dockerfile": ref.dockerfile,
                "args": json.dumps(ref.args),
                "network": ref.network,
                "timeout_seconds": ref.timeout_seconds,
                "size": len(tar),
                "context": tar,
                "now": now,
            },
        )

    def pending(self, engine_id: str, *, now: datetime | None = None) -> bool:
        """Whether a build round has work: runs wait for a digest, or a build of this
        engine is due or orphaned."""
        return bool(self._run(BUILD_WORK, {"engine_id": engine_id, "now": now})[0].pending)

    def request_builds(
        self, engine_id: str, queues: Sequence[str], *, now: datetime | None = None
    ) -> list[str]:
        """Queue this engine's builds of the digests its queues' runs wait for; their tags."""
        rows = self._run(
            REQUEST_BUILDS,
            {
                "engine_id": engine_id,
                "queues": list(queues),
                "max_attempts": self._max_attempts,
                "now": now,
            },
        )
        return [row.tag for row in rows]

    def claim(
        self, *, worker_id: str, engine_id: str, lease_seconds: float, now: datetime | None = None
    ) -> ClaimedBuild | None:
        """Take one due or orphaned build of this engine, with a fresh lease token."""
        rows = self._run(
            CLAIM_BUILD,
            {"worker_id": worker_id, "engine_id": engine_id, "lease": lease_seconds, "now": now},
        )
        if not rows:
            return None
        row = rows[0]
        return ClaimedBuild(
            build_id=row.id,
            lease_token=row.lease_token,
            attempt=row.attempts,
            max_attempts=row.max_attempts,
            recovered=row.recovered,
            deadline_at=row.deadline_at,
            request=BuildRequest(
                tag=row.tag,
                tool=row.tool,
                digest=row.digest,
                context=bytes(row.context),
                dockerfile=row.dockerfile,
                args=dict(row.args),
                network=row.network,
                timeout_seconds=float(row.timeout_seconds),
                meter_name=f"build-{row.id}",
            ),
        )

    def heartbeat(
        self,
        build_id: uuid.UUID,
        token: uuid.UUID,
        *,
        lease_seconds: float,
        now: datetime | None = None,
    ) -> bool:
        """Renew the lease; False when it is no longer ours."""
        params = {"build_id": build_id, "token": token, "lease": lease_seconds, "now": now}
        return bool(self._run(HEARTBEAT_BUILD, params))

    def append_log(
        self, build_id: uuid.UUID, token: uuid.UUID, text: str, *, now: datetime | None = None
    ) -> bool:
        """Append build output (the log keeps its tail); False when the lease is gone."""
        params = {
            "build_id": build_id,
            "token": token,
            "text": text,
            "cap": self._log_cap,
            "now": now,
        }
        return bool(self._run(APPEND_BUILD_LOG, params))

    def ready(
        self,
        build_id: uuid.UUID,
        token: uuid.UUID,
        image_id: str,
        *,
        traceparent: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Record the image (and the build's span, for the waits that link to it); the
        waiting runs' workers are woken. False: lease lost."""
        params = {
            "build_id": build_id,
            "token": token,
            "image_id": image_id,
            "traceparent": traceparent,
            "now": now,
        }
        return bool(self._run(BUILD_READY, params)[0].done)

    def wait_of(self, run_id: uuid.UUID, tag: str, engine_id: str) -> BuildWait | None:
        """When the run was submitted and its build was ready on ``engine_id`` (None: no
        ready build of that tag there)."""
        params = {"run_id": run_id, "tag": tag, "engine_id": engine_id}
        rows = self._run(BUILD_WAIT, params)
        if not rows or rows[0].finished_at is None:
            return None
        row = rows[0]
        return BuildWait(row.queued_at, row.finished_at, row.traceparent)

    def failed(
        self, build_id: uuid.UUID, token: uuid.UUID, error: str, *, now: datetime | None = None
    ) -> tuple[bool, int]:
        """Fail the build and the runs waiting for it (unless another engine has it ready):
        ``(the lease was ours, runs failed)``."""
        params = {"build_id": build_id, "token": token, "error": error, "now": now}
        row = self._run(BUILD_FAILED, params)[0]
        return bool(row.done), int(row.failed)

    def fail_waiting(self, tag: str | None = None, *, now: datetime | None = None) -> int:
        """Fail queued runs of digests whose build failed (``tag``, or every digest)."""
        return int(self._run(FAIL_WAITING, {"tag": tag, "now": now})[0].failed)

    def release(
        self, build_id: uuid.UUID, token: uuid.UUID, *, delay: float, now: datetime | None = None
    ) -> bool:
        """Give the build back uncharged, due again after ``delay`` seconds."""
        params = {"build_id": build_id, "token": token, "delay": delay, "now": now}
        return bool(self._run(RELEASE_BUILD, params))

    def rebuild(
        self,
        tag: str,
        queue: str,
        *,
        force: bool = False,
        live_seconds: float = 60.0,
        now: datetime | None = None,
    ) -> Rebuilt:
        """Queue the digest's build on every engine with a live worker of ``queue`` (failed
        builds again; with ``force`` ready ones too)."""
        row = self._run(
            REBUILD,
            {
                "tag": tag,
                "queue": queue,
                "force": force,
                "live": live_seconds,
                "max_attempts": self._max_attempts,
                "now": now,
            },
        )[0]
        return Rebuilt(again=int(row.again), made=int(row.made))
