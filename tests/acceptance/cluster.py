"""A real cluster for fault tests: worker, reaper and sync-mode API processes, Postgres,
Docker, a checker.

The checker records every accepted run and, once faults heal and the queue drains, asserts
the six invariants: no run lost, no phantom result, exactly one finalize per run, attempts
bounded, no leaked containers, the backlog drains.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx2
from sqlalchemy import Engine, text

from runyard.queue import JobQueue
from runyard.registry.tools import ToolRegistry
from runyard.submission.request import prepare_run

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
RUN_LABEL = "io.runyard.run_id"
# How long an API process may take to answer after its start: its imports alone are seconds
# of CPU, and beside workers and a reaper starting too on two slow cores it took over 30 s.
API_START_SECONDS = 90

FAST_TIMINGS = {
    "RUNYARD_LEASE_SECONDS": "3",
    "RUNYARD_HEARTBEAT_SECONDS": "1",
    "RUNYARD_REAPER_INTERVAL_SECONDS": "0.5",
    "RUNYARD_WORKER_POLL_SECONDS": "0.3",
    "RUNYARD_STOP_GRACE_SECONDS": "1",
    "RUNYARD_RETRY_BACKOFF_BASE_SECONDS": "0.2",
    "RUNYARD_RETRY_BACKOFF_MAX_SECONDS": "1",
    "RUNYARD_SWEEP_INTERVAL_SECONDS": "1",
    "RUNYARD_SWEEP_GRACE_SECONDS": "0",
    "RUNYARD_ENGINE_DEAD_AFTER_SECONDS": "3600",
    "RUNYARD_LOG_FORMAT": "json",
}


@dataclass
class Expected:
    """What the checker expects of one accepted run."""

    status: str
    exit_code: int | None = None
    result: Any = None
    max_attempts: int = 1
    check_result: bool = False


@dataclass
class Cluster:
    """Processes of one test; everything it starts is stopped by ``close``."""

    database_url: str
    engine: Engine
    queue: JobQueue
    registry: ToolRegistry
    logs: Path
    docker_client: docker.DockerClient
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    accepted: dict[uuid.UUID, Expected] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    requests: list[threading.Thread] = field(default_factory=list)

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        return {
            **base,
            "RUNYARD_DATABASE_URL": self.database_url,
            "RUNYARD_TOOLS_FILE": str(ROOT / "tests" / "tools.toml"),
            **FAST_TIMINGS,
            **self.env,
            **(extra or {}),
        }

    def _spawn(self, name: str, argv: list[str], extra: dict[str, str] | None) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, *argv], env=self._env(extra), stdout=log, stderr=log, cwd=ROOT
        )
        log.close()

    def start_worker(
        self, name: str, *, concurrency: int = 2, fault: str | None = None, **extra: str
    ) -> None:
        """Start ``python -m worker`` (optionally dying at a named fault point)."""
        env = {"RUNYARD_WORKER_CONCURRENCY": str(concurrency), "RUNYARD_WORKER_ID": name, **extra}
        if fault:
            env["RUNYARD_FAULT"] = fault
        self._spawn(name, ["-m", "worker"], env)

    def start_reaper(self, name: str = "reaper", **extra: str) -> None:
        """Start ``python -m reaper``."""
        self._spawn(name, ["-m", "reaper"], extra)

    def start_api(self, name: str, *, fault: str | None = None, **extra: str) -> None:
        """Start ``python -m api`` in sync mode (tools run inline) and wait until it answers."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = self.ports.setdefault(name, probe.getsockname()[1])
        env = {"RUNYARD_QUEUE_ENABLED": "false", "RUNYARD_AUTH_DISABLED": "true", **extra}
        if fault:
            env["RUNYARD_FAULT"] = fault
        self._spawn(name, ["-m", "api", "--host", "127.0.0.1", "--port", str(port)], env)
        self.wait_for(lambda: self._answers(port), API_START_SECONDS, f"{name} to answer")

    def _answers(self, port: int) -> bool:
        try:
            return httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx2.HTTPError:
            return False

    def submit_sync(self, api: str, tool: str, value: Any, expected: Expected) -> uuid.UUID | None:
        """POST a run to a sync-mode API from a thread of its own (the answer comes when the
        run ends, or never if the process dies); the run, once recorded, or None if refused."""
        key = uuid.uuid4().hex
        url = f"http://127.0.0.1:{self.ports[api]}/v1/runs"

        def post() -> None:
            try:
                httpx2.post(
                    url,
                    json={"tool": tool, "input": value},
                    headers={"Idempotency-Key": key},
                    timeout=120,
                )
            except httpx2.HTTPError:
                pass  # the API process was killed under the request

        thread = threading.Thread(target=post, name=f"post-{key[:8]}", daemon=True)
        thread.start()
        self.requests.append(thread)
        found: list[uuid.UUID] = []

        def recorded() -> bool:
            with self.engine.connect() as conn:
                run_id = conn.execute(
                    text("SELECT id FROM tool_runs WHERE idempotency_key = :key"), {"key": key}
                ).scalar_one_or_none()
            if run_id is not None:
                found.append(run_id)
            return bool(found) or not thread.is_alive()

        self.wait_for(recorded, 30, "the sync run to be recorded")
        if not found:
            return None
        expected.max_attempts = 1
        self.accepted[found[0]] = expected
        return found[0]

    def signal(self, name: str, sig: int) -> None:
        """Send a signal to one of the processes."""
        self.procs[name].send_signal(sig)

    def kill9(self, name: str) -> None:
        """``kill -9`` and reap."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_exit(self, name: str, timeout: float = 20) -> int:
        """Wait for a process to exit and return its code."""
        return self.procs[name].wait(timeout=timeout)

    def log_of(self, name: str) -> str:
        """What a process logged."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop every process this cluster started (SIGCONT first, in case one is stopped)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)

    # --- runs ---

    def submit(self, tool: str, value: Any, expected: Expected) -> uuid.UUID:
        """Enqueue a run and record what the checker must find at the end."""
        run = prepare_run(self.registry, tenant="acceptance", tool_name=tool, input_value=value)
        run_id = self.queue.enqueue(run).run_id
        expected.max_attempts = run.max_attempts
        self.accepted[run_id] = expected
        return run_id

    def run_row(self, run_id: uuid.UUID) -> Any:
        """The run with its derived counts."""
        with self.engine.connect() as conn:
            return conn.execute(
                text(
                    """
                    SELECT CAST(r.status AS text) AS status, r.exit_code, r.result,
                           r.attempts, r.stdout, r.error_code,
                           (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                              AND e.type = 'status'
                              AND e.data->>'status' IN
                                  ('succeeded', 'failed', 'timed_out', 'cancelled')) AS finals,
                           (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                              AND e.type = 'adopted') AS adoptions,
                           (SELECT count(*) FROM tool_run_events e WHERE e.run_id = r.id
                              AND e.type = 'claimed') AS claims
                    FROM tool_runs r WHERE r.id = :id
                    """
                ),
                {"id": run_id},
            ).one()

    def status(self, run_id: uuid.UUID) -> str:
        """The run's status now."""
        return str(self.run_row(run_id).status)

    def container_state(self, run_id: uuid.UUID, attempt: int = 1) -> str | None:
        """The Docker status of an attempt's container, or None."""
        try:
            return str(self.docker_client.containers.get(f"runyard-{run_id}-{attempt}").status)
        except docker.errors.NotFound:
            return None

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll a condition (every 0.1 s) until it holds."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.diagnostics()}")
            time.sleep(0.1)

    def drain(self, timeout: float = 90) -> None:
        """Wait until every accepted run is terminal, failing once no run has ended for
        ``timeout`` seconds: a stuck run fails the wait, a slow machine does not."""
        open_runs = [r for r in self.accepted if self.status(r) not in TERMINAL]
        stalled_at = time.monotonic() + timeout
        while open_runs:
            if time.monotonic() > stalled_at:
                raise AssertionError(
                    f"no run ended in {timeout} s; {len(open_runs)} still open\n"
                    f"{self.diagnostics()}"
                )
            time.sleep(0.2)
            still_open = [r for r in open_runs if self.status(r) not in TERMINAL]
            if len(still_open) < len(open_runs):
                stalled_at = time.monotonic() + timeout
            open_runs = still_open

    def diagnostics(self) -> str:
        """The tail of each process log, then the statuses, for a failing assertion."""
        lines = []
        for name in self.procs:
            tail = self.log_of(name).splitlines()[-15:]
            lines.append(f"--- {name} (rc={self.procs[name].poll()})")
            lines.extend(tail)
        statuses = {r: self.status(r) for r in self.accepted}
        # The runs still open last, where a cut report keeps them: they are what a drain
        # waits on.
        still_open = [r for r in statuses if statuses[r] not in TERMINAL]
        counts = Counter(statuses.values())
        lines.append(f"--- runs by status: {dict(counts)}")
        lines.extend(f"{r}: {statuses[r]} {self._job(r)}" for r in still_open[:20])
        return "\n".join(lines)

    def _job(self, run_id: uuid.UUID) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT queue, locked_by, locked_until, available_at, engine_id,"
                    " cancel_requested_at FROM tool_run_jobs WHERE run_id = :id"
                ),
                {"id": run_id},
            ).one_or_none()
        return {} if row is None else dict(row._mapping)

    def check_invariants(
        self, *, leak_timeout: float = 15, kept_volumes: frozenset[str] = frozenset()
    ) -> dict[str, int]:
        """Assert the six invariants over every accepted run; return figures.

        ``kept_volumes``: volume records the engine refuses to remove until its next restart.
        """
        self.drain()
        duplicates = 0
        for run_id, expected in self.accepted.items():
            row = self.run_row(run_id)
            context = f"run {run_id}: {dict(row._mapping)}"
            assert row.status == expected.status, context  # no run lost, no phantom result
            if expected.exit_code is not None:
                assert row.exit_code == expected.exit_code, context
            if expected.check_result:
                assert row.result == expected.result, context
            assert row.finals == 1, context  # exactly one finalize
            assert 1 <= row.attempts <= expected.max_attempts, context  # attempts bounded
            duplicates += max(0, int(row.claims) - 1)
        self.wait_for(
            lambda: self._no_leaks(kept_volumes),
            leak_timeout,
            "containers and volumes to be cleaned up",
        )
        return {"runs": len(self.accepted), "extra_attempts": duplicates}

    def _no_leaks(self, kept_volumes: frozenset[str] = frozenset()) -> bool:
        # The low-level listing carries the labels, so nothing is inspected one by one: a
        # container a worker removes meanwhile cannot turn into a 404 here.
        label = {"label": "io.runyard.managed=true"}
        runs = {str(r) for r in self.accepted}
        containers = self.docker_client.api.containers(all=True, filters=label)
        volumes = self.docker_client.api.volumes(filters=label).get("Volumes") or []
        leaked = [c["Id"] for c in containers if (c.get("Labels") or {}).get(RUN_LABEL) in runs]
        leaked += [
            v["Name"]
            for v in volumes
            if (v.get("Labels") or {}).get(RUN_LABEL) in runs and v["Name"] not in kept_volumes
        ]
        return not leaked


def events_of(engine: Engine, run_id: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    """The run's events, oldest first."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT type, data FROM tool_run_events WHERE run_id = :id ORDER BY id"),
            {"id": run_id},
        ).all()
    return [(r.type, r.data if isinstance(r.data, dict) else json.loads(r.data)) for r in rows]
