"""How the CLI waits for a run: ``submit --wait`` (long-polls with one idempotency key) and
``logs --follow`` (the event stream, resumed after the last event), both going on through up
to a minute of the API being unreachable."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO, cast

from runyard_client import (
    Run,
    RunStatus,
    Runyard,
    RunyardError,
    SkippedEvent,
    StatusEvent,
    StderrEvent,
    StdoutEvent,
    WaitTimeoutError,
)
from runyard_client.errors import is_transient

# How long a wait or a follow keeps trying while the API cannot be reached (or answers
# 502/503/504), on top of the client's own retries.
RECONNECT_SECONDS = 60.0
# The pause between two tries while it cannot.
RETRY_PAUSE_SECONDS = 1.0
# Each long-poll slice: after it, the status shown is brought up to date.
WAIT_SLICE_SECONDS = 30.0
# The events whose data the follow prints or ends on; a skipped one of these is counted.
FOLLOWED = ("stdout", "stderr", "status")


class Patience:
    """The window of trouble a wait sits out: a failure that will pass is borne until the
    trouble has lasted ``seconds``; any other failure, or a longer trouble, is raised."""

    def __init__(
        self, seconds: float = RECONNECT_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._seconds = seconds
        self._clock = clock
        self._since: float | None = None

    def failed(self, error: RunyardError) -> None:
        """Bear ``error`` (the caller tries again), or raise it."""
        if not is_transient(error):
            raise error
        now = self._clock()
        self._since = now if self._since is None else self._since
        if now - self._since > self._seconds:
            raise error

    def recovered(self) -> None:
        """An answer came: the next trouble starts a new window."""
        self._since = None


def wait_for_run(
    client: Runyard,
    tool: str,
    value: Any,
    key: str,
    *,
    on_update: Callable[[Run], None],
    depends_on: Sequence[str] = (),
    run_at: datetime | None = None,
    callback_url: str | None = None,
    concurrency_key: str | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> Run:
    """Submit with ``key`` (answered at once, so the run's id is known), then long-poll the
    same submit until the run ends; ``on_update`` gets the run after every answer."""
    fields: dict[str, Any] = {
        "idempotency_key": key,
        "depends_on": depends_on,
        "run_at": run_at,
        "callback_url": callback_url,
        "concurrency_key": concurrency_key,
    }
    run = client.submit(tool, value, **fields)
    on_update(run)
    patience = Patience()
    while not run.done:
        try:
            run = client.run(tool, value, timeout=WAIT_SLICE_SECONDS, **fields)
        except WaitTimeoutError as waited:
            run = cast(Run, waited.last)
        except RunyardError as error:
            patience.failed(error)
            pause(RETRY_PAUSE_SECONDS)
            continue
        patience.recovered()
        on_update(run)
    return run


def follow_logs(client: Runyard, run_id: str, out: TextIO, err: TextIO) -> tuple[str, int]:
    """Write the run's stdout and stderr chunks as they arrive until it ends; the final
    status and how many log or status events could not be read (they are passed over)."""
    status: RunStatus | None = None
    skipped: list[SkippedEvent] = []
    after: int | None = None
    patience = Patience()
    while True:
        try:
            for event in client.events(run_id, after, on_skip=skipped.append):
                patience.recovered()
                after = event.id
                if isinstance(event, StdoutEvent | StderrEvent):
                    target = out if isinstance(event, StdoutEvent) else err
                    target.write(event.text)
                    target.flush()
                elif isinstance(event, StatusEvent):
                    status = event.status
            break
        except RunyardError as error:
            patience.failed(error)
            time.sleep(RETRY_PAUSE_SECONDS)
    if status is None or not status.is_terminal:
        status = client.get(run_id).status  # the stream had no final status (pruned)
    return status.value, sum(1 for item in skipped if item.type in FOLLOWED)
