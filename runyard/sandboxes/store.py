"""Sandboxes in the database: their rows, their commands and their output (``sql.py``)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from runyard.domain.attempt import container_name
from runyard.domain.sandboxes import MAX_EXECS_TOTAL
from runyard.domain.states import RunStatus
from runyard.platform.db import autocommit
from runyard.platform.tracing import TraceContext, Tracing
from runyard.sandboxes import sql

STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class SandboxRow:
    """A sandbox as stored: its own row, its run's status and its job's deadline (the TTL)."""

    run_id: uuid.UUID
    tenant: str
    tool: str
    idle_timeout_seconds: int
    max_execs: int
    last_active_at: datetime
    created_at: datetime
    ready_at: datetime | None
    exec_count: int
    status: RunStatus
    error_code: str | None
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    deadline_at: datetime | None
    engine_id: str | None
    disk_mb: int | None
    container_user: str
    attempt: int

    @property
    def container(self) -> str:
        """The name of its container (its attempt's)."""
        return container_name(self.run_id, self.attempt)


@dataclass(frozen=True)
class OpenExec:
    """A command its owner still has to start, follow or finish."""

    id: uuid.UUID
    status: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    timeout_seconds: int
    started_at: datetime | None
    stdout_end: int
    stderr_end: int
    timed_out: bool
    has_stdin: bool

    def end(self, stream: str) -> int:
        """The bytes of ``stream`` stored so far."""
        return self.stdout_end if stream == "stdout" else self.stderr_end


@dataclass(frozen=True)
class Tick:
    """One round's look at a sandbox: its idle clock, its limit and its open commands."""

    db_now: datetime
    last_active_at: datetime
    idle_timeout_seconds: int
    max_execs: int
    execs: list[OpenExec]


@dataclass(frozen=True)
class ExecRow:
    """A command as its caller sees it."""

    id: uuid.UUID
    run_id: uuid.UUID
    command: list[str]
    cwd: str
    timeout_seconds: int
    status: str
    exit_code: int | None
    timed_out: bool
    error: str | None
    stdout_end: int
    stderr_end: int
    truncated: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    sandbox_status: RunStatus


@dataclass(frozen=True)
class Chunk:
    """Stored bytes of one stream of a command (secrets masked)."""

    stream: str
    offset: int
    length: int
    data: bytes


@dataclass(frozen=True)
class NewExec:
    """A command asked of a sandbox, checked."""

    command: list[str]
    stdin: bytes
    env: dict[str, str]
    cwd: str
    timeout_seconds: int


class SandboxStore:
    """Every sandbox statement, each its own transaction (``autocommit``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _rows(self, statement: Any, params: dict[str, Any]) -> list[Any]:
        return autocommit(self.engine, statement, params)

    # --- sandboxes ---

    def insert_sandbox(
        self, run_id: uuid.UUID, tenant: str, tool: str, idle_timeout_seconds: int, max_execs: int
    ) -> None:
        """Its row (kept if there is one already)."""
        self._rows(
            sql.INSERT_SANDBOX,
            {
                "run_id": run_id,
                "tenant": tenant,
                "tool": tool,
                "idle_timeout_seconds": idle_timeout_seconds,
                "max_execs": max_execs,
            },
        )

    def mark_ready(self, run_id: uuid.UUID) -> None:
        """Its container runs and its workspace is made."""
        self._rows(sql.MARK_READY, {"run_id": run_id})

    def touch(self, run_id: uuid.UUID) -> None:
        """A caller used the sandbox now."""
        self._rows(sql.TOUCH, {"run_id": run_id})

    def view(self, run_id: uuid.UUID, tenant: str | None) -> SandboxRow | None:
        """One sandbox, if ``tenant`` (None: any) may see it."""
        rows = self._rows(sql.SANDBOX_VIEW, {"run_id": run_id, "tenant": tenant})
        return _sandbox(rows[0]) if rows else None

    def page(self, tenant: str, limit: int) -> list[SandboxRow]:
        """A tenant's newest sandboxes."""
        rows = self._rows(sql.LIST_SANDBOXES, {"tenant": tenant, "limit": limit})
        return [_sandbox(row) for row in rows]

    # --- commands, the caller's side ---

    def insert_exec(
        self, run_id: uuid.UUID, new: NewExec, max_total: int = MAX_EXECS_TOTAL
    ) -> uuid.UUID | None:
        """The new command's id; None if the sandbox has ended or had ``max_total``."""
        exec_id = uuid.uuid4()
        rows = self._rows(
            sql.INSERT_EXEC,
            {
                "exec_id": exec_id,
                "run_id": run_id,
                "command": json.dumps(new.command),
                "stdin": new.stdin,
                "env": json.dumps(new.env),
                "cwd": new.cwd,
                "timeout_seconds": new.timeout_seconds,
                "max_total": max_total,
            },
        )
        return exec_id if rows else None

    def exec_view(
        self, run_id: uuid.UUID, exec_id: uuid.UUID, tenant: str | None
    ) -> ExecRow | None:
        """One command of a sandbox ``tenant`` (None: any) may see."""
        rows = self._rows(sql.EXEC_VIEW, {"exec_id": exec_id, "run_id": run_id, "tenant": tenant})
        return _exec_row(rows[0]) if rows else None

    def execs(self, run_id: uuid.UUID, limit: int) -> list[ExecRow]:
        """A sandbox's newest commands (the caller checked who may see it)."""
        rows = self._rows(sql.LIST_EXECS, {"run_id": run_id, "limit": limit})
        return [_exec_row(row) for row in rows]

    def chunks_from(
        self, exec_id: uuid.UUID, stdout_from: int, stderr_from: int, limit: int
    ) -> list[Chunk]:
        """Stored output from the given ends on, in the order it was stored."""
        rows = self._rows(
            sql.CHUNKS_FROM,
            {
                "exec_id": exec_id,
                "stdout_from": stdout_from,
                "stderr_from": stderr_from,
                "limit": limit,
            },
        )
        return [Chunk(row.stream, row.offset, row.length, bytes(row.data)) for row in rows]

    # --- commands, the owner's side ---

    def tick(self, run_id: uuid.UUID, limit: int) -> Tick | None:
        """The sandbox's idle clock and open commands; None without its row."""
        head = self._rows(sql.OWNER_TICK, {"run_id": run_id})
        if not head:
            return None
        rows = self._rows(sql.OPEN_EXECS, {"run_id": run_id, "limit": limit})
        execs = [OpenExec(**row._asdict()) for row in rows]
        first = head[0]
        return Tick(
            db_now=first.db_now,
            last_active_at=first.last_active_at,
            idle_timeout_seconds=first.idle_timeout_seconds,
            max_execs=first.max_execs,
            execs=execs,
        )

    def stdin(self, exec_id: uuid.UUID) -> bytes:
        """What the command reads on its standard input."""
        rows = self._rows(sql.EXEC_STDIN, {"exec_id": exec_id})
        return bytes(rows[0].stdin) if rows else b""

    def mark_running(self, exec_id: uuid.UUID) -> datetime | None:
        """``pending`` → ``running``; its start time, or None if it was not pending."""
        rows = self._rows(sql.MARK_EXEC_RUNNING, {"exec_id": exec_id})
        return rows[0].started_at if rows else None

    def append(
        self, exec_id: uuid.UUID, stream: str, offset: int, length: int, data: bytes
    ) -> bool:
        """Store bytes at ``offset`` of ``stream``; False if the stored end is elsewhere."""
        rows = self._rows(
            sql.APPEND_CHUNK,
            {
                "exec_id": exec_id,
                "stream": stream,
                "offset": offset,
                "length": length,
                "data": data,
            },
        )
        return bool(rows)

    def ends(self, exec_id: uuid.UUID) -> tuple[int, int]:
        """The stored ends of stdout and stderr."""
        rows = self._rows(sql.EXEC_ENDS, {"exec_id": exec_id})
        return (rows[0].stdout_end, rows[0].stderr_end) if rows else (0, 0)

    def mark_timed_out(self, exec_id: uuid.UUID) -> None:
        """The command ran past its timeout and is being killed."""
        self._rows(sql.MARK_EXEC_TIMED_OUT, {"exec_id": exec_id})

    def finish(
        self, exec_id: uuid.UUID, exit_code: int | None, *, truncated: bool, error: str | None
    ) -> bool:
        """The command ended with every byte stored; False if it had ended already."""
        rows = self._rows(
            sql.FINISH_EXEC,
            {"exec_id": exec_id, "exit_code": exit_code, "truncated": truncated, "error": error},
        )
        if rows:
            self._finished(exec_id, exit_code, error, rows[0])
        return bool(rows)

    def _finished(
        self, exec_id: uuid.UUID, exit_code: int | None, error: str | None, row: Any
    ) -> None:
        """What else happens once a command is ended (nothing here)."""

    def traced(self, tracing: Tracing, parent: TraceContext | None) -> SandboxStore:
        """This store, each command it finishes a span of ``parent`` (the sandbox's attempt)
        when tracing is on."""
        if not tracing.enabled or parent is None:
            return self
        return TracedSandboxStore(self.engine, tracing, parent)

    def end_open(self, run_id: uuid.UUID, error: str) -> None:
        """The sandbox ended: its unfinished commands end with ``error``."""
        self._rows(sql.END_OPEN_EXECS, {"run_id": run_id, "error": error})


class TracedSandboxStore(SandboxStore):
    """A store whose ``finish`` also records the command as a ``sandbox.exec`` span: made
    when the command is seen finished (once, by whichever owner ends it), its times the
    database's, so a command an earlier owner started is one span too."""

    def __init__(self, engine: Engine, tracing: Tracing, parent: TraceContext) -> None:
        super().__init__(engine)
        self._tracing = tracing
        self._parent = parent

    def _finished(
        self, exec_id: uuid.UUID, exit_code: int | None, error: str | None, row: Any
    ) -> None:
        """The command's span, from its row's times."""
        attributes: dict[str, str | int | float | bool] = {
            "runyard.exec_id": str(exec_id),
            "runyard.timed_out": row.timed_out,
        }
        if exit_code is not None:
            attributes["process.exit.code"] = exit_code
        self._tracing.record(
            "sandbox.exec",
            start=row.started_at or row.created_at,
            end=row.finished_at,
            parent=self._parent,
            attributes=attributes,
            failed=error or (f"exit code {exit_code}" if exit_code else None),
        )


def _exec_row(row: Any) -> ExecRow:
    fields = row._asdict()
    fields["sandbox_status"] = RunStatus(fields["sandbox_status"])
    return ExecRow(**fields)


def _sandbox(row: Any) -> SandboxRow:
    fields = row._asdict()
    fields["status"] = RunStatus(fields["status"])
    return SandboxRow(**fields)
