"""The CLI as a real process against a live API: the harness of the CLI tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from starlette.types import ASGIApp, Receive, Scope, Send

from runyard.domain.attempt import AttemptResult
from runyard.domain.states import RunStatus
from runyard.queue import JobQueue
from tests.integration.api.test_api_helpers import wait_until

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "runyard.cli"]


class RecordRequests:
    """ASGI middleware: notes (method, path, query) of every HTTP request."""

    def __init__(self, app: ASGIApp, log: list[tuple[str, str, str]]) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.log.append((scope["method"], scope["path"], scope["query_string"].decode()))
        await self.app(scope, receive, send)


@dataclass
class Api:
    url: str
    key: str
    engine: Engine
    queue: JobQueue
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        return base | {"RUNYARD_URL": self.url, "RUNYARD_API_KEY": self.key}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    @contextmanager
    def start(self, *args: str) -> Iterator[subprocess.Popen[str]]:
        """The CLI running in the background; killed if the test leaves it running."""
        proc = subprocess.Popen(
            [*CLI, *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A shell runs background jobs with SIGINT ignored, and an ignored SIGINT stays
            # ignored across exec: the CLI gets Ctrl-C as a terminal would send it, whatever
            # started the test run.
            preexec_fn=_default_sigint,
        )
        with proc:
            try:
                yield proc
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate(timeout=10)

    def only_run_id(self) -> uuid.UUID | None:
        with self.engine.connect() as conn:
            ids = conn.execute(text("SELECT id FROM tool_runs")).scalars().all()
        assert len(ids) <= 1, ids
        return uuid.UUID(str(ids[0])) if ids else None

    def finish(self, status: RunStatus, result: Any = None) -> uuid.UUID:
        """Bring the one queued run to ``status`` as a worker (or a cancel) would."""
        run_id: uuid.UUID = wait_until(self.only_run_id)
        if status is RunStatus.CANCELLED:
            assert self.queue.cancel(run_id).cancelled_now
            return run_id
        [job] = self.queue.claim(worker_id="w-cli", engine_id="e-cli", limit=1, lease_seconds=30)
        outcome = AttemptResult(
            status=status,
            exit_code=0 if status is RunStatus.SUCCEEDED else 3,
            result=result,
            error_code=None if status is RunStatus.SUCCEEDED else status.value,
            error=None if status is RunStatus.SUCCEEDED else "as the test said",
        )
        assert self.queue.finalize(job.job_id, job.lease_token, outcome)
        return run_id


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
